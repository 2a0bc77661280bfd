package main

// The general information of the OpenAPI (Swagger 2.0) spec that swag
// generates into docs/ (make docs); the operations are annotated on the
// handlers. host is deliberately absent, so Swagger UI sends requests to
// whatever address served the page.

//	@title			valruns API
//	@version		1.0.0
//	@description	valruns starts **validation runs** of **workflows**: create a workflow (a JSON Schema and CEL assertions), start a run of it over a JSON submission, and poll the run until it has `passed`, `failed` or ended in `error`.
//	@description
//	@description	**Authentication.** Every `/api/` route needs `Authorization: Bearer vr_...`, an API token of one organisation (`valruns token create --org SLUG`). Everything a token can see belongs to its organisation: another organisation's workflow or run is a 404.
//	@description
//	@description	**Idempotency.** `POST /api/workflows/` and `POST /api/workflows/{id}/start/` accept an `Idempotency-Key` header (1 to 255 printable ASCII characters, bare `abc` or quoted `"abc"`; a new UUID per operation), so a client can retry after a network failure without creating, or billing, twice. Keys are scoped per organisation and endpoint and kept 24 h; `Idempotency-Key-Expires` says until when. A retry with the same key and body gets the first answer back, byte for byte, with `Idempotent-Replayed: true` and `Original-Request-Id`; the same key with another body is a 422 (`idempotency_key_reused`); a retry while the first request is still being processed is a 409 (`idempotency_key_in_progress`) with `Retry-After`, or, with `Prefer: wait=N`, waits for the first answer (`Preference-Applied: wait=N`). A request that failed with a 5xx stored nothing and may be retried with the same key. Each operation's description has the rules.
//	@description
//	@description	**Trailing slashes are deliberate.** Every route answers with and without a trailing slash, the same answer and no redirect. This document writes each path in its canonical form, which for the routes of workflows, runs and webhook endpoints ends with a slash (`/api/workflows/{id}/start/`), on purpose: `x-trailing-slash` says so for tools, and a linter's rule against a trailing slash (Redocly's `no-path-trailing-slash`, Spectral's `path-keys-no-trailing-slash`) does not apply to this API.
//	@description
//	@description	**Request bodies** are JSON objects, decoded strictly: a member the operation does not take is a 400 `validation_error`, and so is a string or member name anywhere in a body, a submission included, that holds the NUL character (`\u0000`), which the database cannot store.
//	@description
//	@description	**Errors** are RFC 9457 problem documents (`application/problem+json`) with `type`, `title`, `status`, `detail` and a stable `code` to switch on. Every answer carries an `X-Request-Id` (yours when you send a sane one); quote it to support. Every 5xx carries `Retry-After`.
//	@description
//	@description	**Examples.** Every response below shows an answer the API gave: the examples are recorded from the real service, with ids and times replaced by fixed values.
//	@BasePath		/
//	@x-trailing-slash	{"canonical": true, "optional": true, "redirect": false, "description": "A path of this document that ends with a slash does so on purpose: it is the canonical form. Every route answers with and without a trailing slash, the same answer and no redirect."}

//	@tag.name			workflows
//	@tag.description.markdown
//	@tag.name			runs
//	@tag.description.markdown
//	@tag.name			usage
//	@tag.description	What the organisation is billed: its runs this month and its quota.
//	@tag.name			webhooks
//	@tag.description.markdown
//	@tag.name			idempotency
//	@tag.description	Look up one of your Idempotency-Keys: did the request with it go through, and what did it create?
//	@tag.name			health
//	@tag.description	Liveness, readiness and Prometheus metrics, without authentication.
//	@tag.name			meta
//	@tag.description	Where to find the rest of the API.

//	@securityDefinitions.apikey	BearerAuth
//	@in							header
//	@name						Authorization
//	@description				An API token of your organisation, with its scheme: enter `Bearer vr_...` (the word Bearer, a space, then the token). `valruns token create --org SLUG` prints one.
