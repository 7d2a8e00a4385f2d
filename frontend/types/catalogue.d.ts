// A metric as the pages read it from GET /api/v1/catalogue (its home is packscope/core/catalogue.py):
// only the fields the modules use. A channel's loss and the ranks' spread are built in this shape too.

interface Metric {
  name: string;
  label: string;
  unit: string;
  format: string;
  doc?: string;
}
