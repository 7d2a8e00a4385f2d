// ESLint for the dashboard's ES modules (frontend/static), their node:test tests (tests/js) and
// the plotly.js bundle's build script (frontend/plotly_bundle.mjs), run by `make lint`.
// The recommended rules; the browser's globals, and plotly.js's `Plotly`, which the pages load
// as a classic script (/vendor/plotly.min.js) before the modules that draw with it.
import js from "@eslint/js";
import globals from "globals";

export default [
  js.configs.recommended,
  {
    files: ["frontend/static/**/*.js"],
    languageOptions: {
      ecmaVersion: "latest",
      sourceType: "module",
      globals: { ...globals.browser, Plotly: "readonly" },
    },
  },
  {
    files: ["tests/js/**/*.mjs", "frontend/plotly_bundle.mjs"],
    languageOptions: { ecmaVersion: "latest", sourceType: "module", globals: globals.node },
  },
];
