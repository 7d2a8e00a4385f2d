// @ts-check
// Tiny DOM helpers shared by the pages.

/** @typedef {Node | string | null | undefined} Child */

/**
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Record<string, any>} [attrs]
 * @param {Child | Child[]} [children]
 * @returns {HTMLElementTagNameMap[K]}
 */
export function el(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  node.append(...[].concat(children).filter((child) => child !== null && child !== undefined));
  return node;
}

export function statusBadge(status) {
  return el("span", { class: `badge status-${status}`, text: status });
}

// One place for errors, so a failing API call is visible instead of a silent blank page.
export function showError(error, prefix = "Could not load data: ") {
  const box = document.getElementById("error");
  if (!box) return;
  box.hidden = !error;
  box.textContent = error ? `${prefix}${error.message}` : "";
}
