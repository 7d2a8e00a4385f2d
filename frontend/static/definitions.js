// @ts-check
// Metric labels that explain themselves: the catalogue's definition on hover, and a link to a
// "What these numbers mean" list on the same page (docs/flops.md is not served by the dashboard).

import { metricOf } from "./catalogue.js";
import { countColorOf } from "./colors.js";
import { el } from "./dom.js";
import { unitInLabel } from "./format.js";

const anchor = (name) => `def-${name}`;

// A label for a table header or card: hover shows the definition, click jumps to it.
// A FLOPs count carries its chart colour as a swatch.
export function metricLabel(metric) {
  const color = countColorOf(metric.name);
  return el("span", {}, [
    color ? el("span", { class: `swatch ${color}` }) : null,
    el("a", { class: "metric-label", href: `#${anchor(metric.name)}`, title: metric.doc, "data-label-of": metric.name, text: metric.label }),
  ]);
}

// Fills <section id="definitions"> with the definitions of the metrics the page shows.
export function renderDefinitions(catalogue, names) {
  const section = document.getElementById("definitions");
  if (!section) return;
  const items = [...new Set(names)].flatMap((name) => {
    const metric = metricOf(catalogue, name);
    return [
      el("dt", { id: anchor(name) }, [metric.label, metric.unit && !unitInLabel(metric) ? el("span", { class: "muted", text: ` (${metric.unit})` }) : null]),
      el("dd", { text: metric.doc }),
    ];
  });
  section.querySelector("dl").replaceChildren(...items);
  section.hidden = false;
}
