// strip-schema-examples.js IN OUT: writes the OpenAPI 3 document IN to OUT without the
// `example` of its component schemas (and their properties), and changes nothing else.
//
// Portman 1.33's fuzzer reads keywords inside an example value as if they were the schema's:
// CreateWorkflowRequest's example holds a JSON Schema for the submission ("required":
// ["customer", "total"], "minLength": 1), so it generated "required schema.customer" and
// "minimum length schema.customer" variations of a free-form member and expected 400 for
// them, which the server rightly answers 201 (the member is any JSON Schema). Examples
// constrain nothing, so the fuzzer sees the same rules without them; the request bodies
// come from portman-config.json's overwrites instead.
"use strict";
const fs = require("fs");
const doc = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const strip = (s) => {
  if (!s || typeof s !== "object") return;
  delete s.example;
  for (const p of Object.values(s.properties || {})) strip(p);
  if (s.items) strip(s.items);
};
for (const s of Object.values((doc.components || {}).schemas || {})) strip(s);
fs.writeFileSync(process.argv[3], JSON.stringify(doc, null, 2));
