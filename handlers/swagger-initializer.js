// Swagger UI's initializer, served at /swagger/swagger-initializer.js in
// place of gin-swagger's: the same options, plus a request interceptor.
//
// The interceptor gives every "Try it out" POST whose Idempotency-Key field
// was left empty a new random key (a UUID v4), at every Execute. So no two
// visitors, and no two executions, share a key, and none gets another's
// replay or a 422; a visitor who types a key keeps it (to try a retry).
// The curl line Swagger UI shows holds the key that was sent.
window.onload = function () {
  function uuid4() {
    if (window.crypto && typeof window.crypto.randomUUID === "function") {
      return window.crypto.randomUUID(); // secure contexts (https, localhost)
    }
    // Plain http on another host: getRandomValues is there all the same.
    const b = window.crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
    return h.slice(0, 8) + "-" + h.slice(8, 12) + "-" + h.slice(12, 16) + "-" + h.slice(16, 20) + "-" + h.slice(20);
  }

  function withIdempotencyKey(req) {
    if (String(req.method).toUpperCase() !== "POST") {
      return req;
    }
    req.headers = req.headers || {};
    for (const name of Object.keys(req.headers)) {
      if (name.toLowerCase() === "idempotency-key") {
        if (String(req.headers[name]).trim() !== "") {
          return req; // typed in: kept
        }
        delete req.headers[name];
      }
    }
    req.headers["Idempotency-Key"] = uuid4();
    return req;
  }

  window.ui = SwaggerUIBundle({
    url: "openapi.json", // the OpenAPI 3 document; doc.json is the same as Swagger 2.0
    dom_id: "#swagger-ui",
    validatorUrl: null,
    persistAuthorization: false,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
    plugins: [SwaggerUIBundle.plugins.DownloadUrl],
    layout: "StandaloneLayout",
    docExpansion: "list",
    deepLinking: true,
    defaultModelsExpandDepth: 1,
    requestInterceptor: withIdempotencyKey,
  });
};
