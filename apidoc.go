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
//	@description	**Idempotency.** `POST /api/workflows/`, `POST /api/workflows/{id}/start/` and the webhook routes that create or send something accept an `Idempotency-Key` header (a new UUID per operation, the same on every retry of it): retries then create, and bill, once and get the first answer back. The rules, in full: [Idempotency](https://github.com/valruns/valruns/blob/main/docs/api.md#idempotency); the tags below summarise them.
//	@description
//	@description	**Trailing slashes are deliberate.** Every route answers with and without a trailing slash, the same answer and no redirect. This document writes each path in its canonical form, which for the routes of workflows, runs and webhook endpoints ends with a slash (`/api/workflows/{id}/start/`), on purpose: `x-trailing-slash` says so for tools, and a linter's rule against a trailing slash (Redocly's `no-path-trailing-slash`, Spectral's `path-keys-no-trailing-slash`) does not apply to this API.
//	@description
//	@description	**Request bodies** are JSON objects, decoded strictly: a member the operation does not take is a 400 `validation_error`, and so is a string or member name anywhere in a body, a submission included, that holds the NUL character (`\u0000`), which the database cannot store.
//	@description
//	@description	**Errors** are RFC 9457 problem documents (`application/problem+json`) with `type`, `title`, `status`, `detail` and a stable `code` to switch on. Every answer carries an `X-Request-Id` (yours when you send a sane one); quote it to support. Every 5xx carries `Retry-After`. Every code, and whether to retry: [Errors](https://github.com/valruns/valruns/blob/main/docs/api.md#errors).
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
