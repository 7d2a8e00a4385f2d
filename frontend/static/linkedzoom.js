// @ts-check
// Zooming one chart zooms the others on x (they all plot against the optimizer step).
// Plotly fires plotly_relayout for our own relayout calls too; `syncing` stops the echo.

let syncing = false;
/** @type {Set<PlotlyPlot>} */
const linked = new Set();

/** @param {Record<string, any>} event a plotly_relayout event */
function xRangeOf(event) {
  if (event["xaxis.autorange"]) return { "xaxis.autorange": true };
  if ("xaxis.range[0]" in event) return { "xaxis.range": [event["xaxis.range[0]"], event["xaxis.range[1]"]] };
  if (Array.isArray(event["xaxis.range"])) return { "xaxis.range": [...event["xaxis.range"]] };
  return null; // a y-only zoom or a resize: nothing to share
}

/**
 * @param {PlotlyPlot} source
 * @param {Record<string, any>} event
 */
async function follow(source, event) {
  const update = xRangeOf(event);
  if (syncing || !update) return;
  syncing = true;
  try {
    const others = [...linked].filter((plot) => plot !== source && plot.data);
    await Promise.all(others.map((plot) => Plotly.relayout(plot, update)));
  } finally {
    syncing = false;
  }
}

// Call after each Plotly.react on `plot`. Plotly.purge drops the plot's listeners, so a plot
// drawn again after purging (see unlinkX) is listened to afresh.
/** @param {PlotlyPlot} plot */
export function linkX(plot) {
  if (linked.has(plot)) return;
  linked.add(plot);
  plot.on("plotly_relayout", (event) => follow(plot, event));
}

/** @param {PlotlyPlot} plot */
export function unlinkX(plot) {
  linked.delete(plot);
}
