// The part of plotly.js that the pages use: its global `Plotly` (the pages load
// /vendor/plotly.min.js as a classic script before their modules) and the plot element it draws in.

interface PlotlyPlot extends HTMLElement {
  data?: any[];
  layout?: any;
  _fullLayout?: any; // plotly's resolved layout, as last drawn (not public API: the bundle is pinned)
  on(event: string, handler: (event: any) => void): void;
}

declare const Plotly: {
  react(plot: HTMLElement, data: object[], layout?: object, config?: object): Promise<PlotlyPlot>;
  relayout(plot: HTMLElement, update: object): Promise<PlotlyPlot>;
  restyle(plot: HTMLElement, update: object, indices?: number[]): Promise<PlotlyPlot>;
  extendTraces(plot: HTMLElement, update: { x: unknown[][]; y: unknown[][] }, indices: number[]): Promise<PlotlyPlot>;
  redraw(plot: HTMLElement): Promise<PlotlyPlot>;
  purge(plot: HTMLElement): void;
};
