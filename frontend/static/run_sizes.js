// @ts-check
// How much the run page asks for at once; shared with run_early.js, which asks before the page does.

export const SERIES_POINTS = 500;
export const HEATMAP_COLUMNS = 200; // each one interval's JSON row per rank to read
export const RANK_POINTS = 200; // intervals sampled for the Ranks panel (up to 64 ranks x 200 heatmap cells)
