// summary.js REPORT: prints what newman's JSON report says of a fuzz-spec run (scripts/fuzz-spec.sh):
// requests sent, assertions checked, and each disagreement between the spec and the server (a
// failed assertion: the request's name, method and URL, the status the server answered, the
// assertion and its message). Exits 1 when there is a disagreement or a request could not be sent.
"use strict";
const fs = require("fs");
const report = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const run = report.run;
const st = run.stats;
const byItem = new Map();
for (const ex of run.executions) byItem.set(ex.item.id, ex);
const statuses = {};
for (const ex of run.executions) {
  const code = ex.response ? ex.response.code : "no answer";
  statuses[code] = (statuses[code] || 0) + 1;
}
console.log("fuzz-spec summary");
console.log(`  requests sent:        ${st.requests.total} (failed to send: ${st.requests.failed})`);
console.log(`  answers by status:    ${Object.entries(statuses).map(([k, v]) => `${k}: ${v}`).join(", ")}`);
console.log(`  assertions checked:   ${st.assertions.total}`);
console.log(`  disagreements:        ${st.assertions.failed} failed assertion(s)`);
const seen = new Set();
for (const f of run.failures) {
  const name = f.source && f.source.name ? f.source.name : "?";
  const ex = f.source && byItem.get(f.source.id);
  let where = "";
  if (ex && ex.request) {
    const u = ex.request.url;
    const path = "/" + (u.path || []).join("/") + (u.query && u.query.length ? "?" + u.query.map((q) => `${q.key}=${q.value}`).join("&") : "");
    where = ` ${ex.request.method} ${path} -> ${ex.response ? ex.response.code : "no answer"}`;
  }
  const key = `${name}|${f.error.test}|${f.error.message}`;
  if (seen.has(key)) continue;
  seen.add(key);
  console.log(`  - [${name}]${where}\n      ${f.error.test || f.error.name}: ${f.error.message}`);
}
process.exit(st.assertions.failed > 0 || st.requests.failed > 0 ? 1 : 0);
