// @ts-check
// Modal <dialog>s whose form uses method="dialog": open one, resolve with the button pressed
// ("cancel" also for Escape), so a caller can `await` a confirmation.

/**
 * @param {HTMLDialogElement} dialog
 * @param {{ onOpen?: (dialog: HTMLDialogElement) => void }} [options]
 * @returns {Promise<string>}
 */
export function ask(dialog, { onOpen } = {}) {
  return new Promise((resolve) => {
    const done = () => {
      dialog.removeEventListener("close", done);
      resolve(dialog.returnValue || "cancel");
    };
    dialog.returnValue = "";
    dialog.addEventListener("close", done);
    onOpen?.(dialog);
    dialog.showModal();
  });
}

export function setDialogError(dialog, message) {
  const box = dialog.querySelector(".dialog-error");
  if (!box) return;
  box.hidden = !message;
  box.textContent = message || "";
}
