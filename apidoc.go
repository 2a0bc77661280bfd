package main

// The general information of the OpenAPI (Swagger 2.0) spec that swag
// generates into docs/ (make docs); the operations are annotated on the
// handlers. host is deliberately absent, so Swagger UI sends requests to
// whatever address served the page. @version is the release, its one
// source: CHANGELOG.md's newest release (TestReleaseIsChangelogs), which
// `valruns version` prints (internal/cli.Release) and GET / answers; raise
// it with the CHANGELOG, then make docs.

//	@title			valruns API
//	@version		0.1.0
//	@description	valruns starts **validation runs** of **workflows**: create a workflow (a JSON Schema and CEL assertions), start a run of it over a JSON submission, and poll the run until it has `passed`, `failed` or ended in `error`.
//	@description
//	@description	**Authorize** with `Bearer vr_...`, an API token of your organisation. **Send an `Idempotency-Key`** with every POST: a retry with the same key and body gets the first answer back, and nothing is done twice. **Errors** are problem documents whose `type` is the page of their `code` ([/problems/](/problems/) lists them).
//	@description
//	@description	The rules of the API (idempotency, errors, limits and rate limits) are in [docs/api.md](https://github.com/valruns/valruns/blob/main/docs/api.md); each operation below has its own. Every example is an answer the API gave. **Trailing slashes are deliberate**: every route answers with and without one, and `x-trailing-slash` says so for tools.
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
