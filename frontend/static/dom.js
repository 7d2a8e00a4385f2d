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
  const list = Array.isArray(children) ? children : [children];
  node.append(...list.filter(/** @returns {child is Node | string} */ (child) => child !== null && child !== undefined));
  return node;
}

const SVG = "http://www.w3.org/2000/svg";

/**
 * An SVG element with its attributes (and text).
 * @template {keyof SVGElementTagNameMap} K
 * @param {K} name
 * @param {Record<string, string | number>} [attributes]
 * @param {string} [text]
 * @returns {SVGElementTagNameMap[K]}
 */
export function svgNode(name, attributes = {}, text) {
  const made = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) made.setAttribute(key, String(value));
  if (text !== undefined) made.textContent = text;
  return made;
}

/** @param {string} status */
export function statusBadge(status) {
  return el("span", { class: `badge status-${status}`, text: status });
}

// One place for errors, so a failing API call is visible instead of a silent blank page.
/**
 * @param {unknown} error what was thrown (null: clear the box)
 * @param {string} [prefix]
 */
export function showError(error, prefix = "Could not load data: ") {
  const box = document.getElementById("error");
  if (!box) return;
  box.hidden = !error;
  box.textContent = error ? `${prefix}${error instanceof Error ? error.message : String(error)}` : "";
}
