package problem

import "slices"

// Code is the stable machine-readable code of a kind of problem. Its only
// values are the ones declared below, each with its page: a handler cannot
// answer a code that has no page (the type has no exported constructor),
// and TestNoDetailsLiterals keeps problem.Details{Code: ...} literals out
// of the service's code.
type Code struct{ name string }

// String is the code as a problem document carries it.
func (c Code) String() string { return c.name }

// Page documents a code: what served at /problems/<code> and listed in
// docs/api.md's table of errors.
type Page struct {
	// Code is the code the page is for.
	Code Code
	// Statuses are the HTTP statuses answered with the code.
	Statuses []int
	// Title names the problem in a few words.
	Title string
	// Markdown says what the problem means and what to do about it: plain
	// paragraphs, "- " lists, `code` and [links](url) (RenderHTML).
	Markdown string
}

// pages holds every Page, in the order declared below (define).
var pages []Page

// define declares a code and its page.
func define(name string, statuses []int, title, markdown string) Code {
	c := Code{name}
	pages = append(pages, Page{Code: c, Statuses: statuses, Title: title, Markdown: markdown})
	return c
}

// Pages are the pages of every code the service can answer, in a reading
// order: requests, authentication, idempotency, limits, the server.
func Pages() []Page { return slices.Clone(pages) }

// Lookup is the page of the code named name.
func Lookup(name string) (Page, bool) {
	i := slices.IndexFunc(pages, func(p Page) bool { return p.Code.name == name })
	if i < 0 {
		return Page{}, false
	}
	return pages[i], true
}

// The codes. A new one needs a page: say what happened, whether anything
// was done, and what the client should do next.
var (
	ValidationError = define("validation_error", []int{400}, "The request is not valid",
		"A field of the request is missing, has the wrong type, or breaks a rule of the API "+
			"(an unknown field, a bad UUID, a filter out of range). "+
			"`detail` names the first fault; `errors` lists each field and what is wrong with it when there are several.\n\n"+
			"Nothing was done. Fix the request and send it with a new `Idempotency-Key`: "+
			"this answer may be stored against the old key, which then answers it again.")
	InvalidWorkflow = define("invalid_workflow", []int{400}, "The workflow does not compile",
		"The workflow's JSON Schema or one of its CEL assertions does not compile. "+
			"`errors` names the field (such as `assertions[0].expr`) and the compiler's message.\n\n"+
			"Nothing was created. Fix the expression or the schema and create the workflow with a new `Idempotency-Key`.")
	InvalidJSON = define("invalid_json", []int{400}, "The body is not a JSON object",
		"The body could not be read as one JSON object: it is empty, malformed, repeats a key, or is not an object.\n\n"+
			"Nothing was done. Send a JSON object with `Content-Type: application/json`.")
	InvalidNumber = define("invalid_number", []int{400}, "A number cannot be stored as sent",
		"A number in the body has more digits than PostgreSQL can keep exactly, so it would not be stored as sent. "+
			"`errors` names where it is.\n\n"+
			"Nothing was done. Send the number with fewer digits, or as a string.")
	InvalidCursor = define("invalid_cursor", []int{400}, "The cursor is not one this API returned",
		"A list's `cursor` parameter is not one the API gave in a `next_cursor`, or it was made for another filter.\n\n"+
			"Start the listing again without a cursor, and pass on `next_cursor` exactly as returned.")
	UnsupportedContentEncoding = define("unsupported_content_encoding", []int{415}, "The body's encoding is not accepted",
		"The request's `Content-Encoding` is neither absent, `identity`, nor `gzip`. "+
			"The answer's `Accept-Encoding` header lists what is accepted.\n\n"+
			"Nothing was done. Send the body as is, or gzip-encoded.")
	RequestBodyTooLarge = define("request_body_too_large", []int{413}, "The body is too large",
		"The body (after gzip, if sent gzip-encoded) is over `MAX_BODY_BYTES`, 1 MiB unless the server sets another limit.\n\n"+
			"Nothing was done. Send a smaller body.")
	RequestBodyTimeout = define("request_body_timeout", []int{408}, "The body arrived too slowly",
		"The server stopped waiting for the rest of the body: it arrived slower than its read timeout allows.\n\n"+
			"Nothing was done. Send the request again, with the same `Idempotency-Key`.")
	NotFound = define("not_found", []int{404}, "Not found",
		"No route matches the request, or the resource it names does not exist in your organisation "+
			"(another organisation's resources are not found either).\n\n"+
			"Check the path and the id; `GET /` lists the service's entry points.")
	MethodNotAllowed = define("method_not_allowed", []int{405}, "Method not allowed",
		"The path exists, but not with this method.\n\n"+
			"Use one of the methods the answer's `Allow` header lists.")
	Unauthenticated = define("unauthenticated", []int{401}, "No credentials",
		"The request carries no API token, or more than one.\n\n"+
			"Send exactly one `Authorization: Bearer vr_...` header. `valruns token create --org SLUG` makes a token.")
	InvalidToken = define("invalid_token", []int{401}, "The API token is not valid",
		"The API token is unknown or has been revoked, or its organisation no longer exists.\n\n"+
			"Use a current token; `valruns token create --org SLUG` makes a new one.")
	IdempotencyKeyMissing = define("idempotency_key_missing", []int{400}, "An Idempotency-Key is required",
		"This server requires an `Idempotency-Key` header on every POST that creates or changes something "+
			"(`IDEMPOTENCY_KEY_REQUIRED`).\n\n"+
			"Nothing was done. Send the request again with a key that is unique to this operation, such as a UUID.")
	IdempotencyKeyInvalid = define("idempotency_key_invalid", []int{400}, "The Idempotency-Key is not valid",
		"The `Idempotency-Key` is empty, holds characters other than printable ASCII, or was sent more than once.\n\n"+
			"Nothing was done. Send exactly one key of 1 to 255 printable ASCII characters.")
	IdempotencyKeyTooLong = define("idempotency_key_too_long", []int{400}, "The Idempotency-Key is too long",
		"The `Idempotency-Key` is longer than 255 characters.\n\n"+
			"Nothing was done. Send a shorter key; a UUID is 36 characters.")
	IdempotencyKeyReused = define("idempotency_key_reused", []int{422}, "The Idempotency-Key was used for another request",
		"The key was first used, in this scope, for a different request: another method, path or body, "+
			"which `detail` names (\"with a different request path\"). "+
			"The first request's answer stands, and this request was not done.\n\n"+
			"Use a new key for a new request. To see what the key holds, "+
			"`GET /api/idempotency-keys/{scope}/{key}/`.")
	IdempotencyKeyInProgress = define("idempotency_key_in_progress", []int{409}, "A request with this key is still being processed",
		"A request with the same `Idempotency-Key` has not finished yet.\n\n"+
			"Retry after `Retry-After` seconds with the same key and body: you get its answer once it is done. "+
			"Or send `Prefer: wait=N` to wait for it in one request.")
	RateLimited = define("rate_limited", []int{429}, "Too many starts",
		"The organisation started more runs per second than its rate allows (`ORG_START_RATE`). "+
			"Nothing was done or stored; the headers `RateLimit`, `RateLimit-Policy` and `Retry-After` say when to come back.\n\n"+
			"Retry after `Retry-After` seconds, with the same `Idempotency-Key`.")
	QuotaExceeded = define("quota_exceeded", []int{429}, "The monthly quota of runs is used up",
		"The organisation has started as many runs this month as its quota allows. "+
			"The answer is stored against the `Idempotency-Key`: a retry with the same key gets it again.\n\n"+
			"`GET /api/usage/` shows the quota and what is used. Wait for the next month, or ask the operator to raise the quota "+
			"(`valruns org quota`), then start with a new key.")
	TestEventsPending = define("test_events_pending", []int{429}, "Too many test events are waiting",
		"The webhook endpoint already has the most test events allowed waiting for their first attempt.\n\n"+
			"Wait for them to be attempted (`GET /api/webhook-endpoints/{id}/deliveries/`), "+
			"then send a new request with a new `Idempotency-Key`.")
	ResponseTooLarge = define("response_too_large", []int{413}, "The answer would be too large",
		"The answer to the request would be larger than the server keeps for an idempotent replay (4 x `MAX_BODY_BYTES`).\n\n"+
			"Nothing was done. Send a smaller request.")
	Overloaded = define("overloaded", []int{503}, "The server is busy",
		"The process is serving as many requests, or request bodies, as it may at once "+
			"(`MAX_REQUESTS_IN_FLIGHT`, `MAX_BODY_BYTES_IN_FLIGHT`). Nothing was done.\n\n"+
			"Retry after `Retry-After` seconds, with the same `Idempotency-Key`.")
	ServiceUnavailable = define("service_unavailable", []int{503}, "The database is unavailable",
		"The database could not be reached or stopped answering. `detail` says whether the request was done: "+
			"usually nothing was; when the database stopped answering after the commit was sent, whether it was done is unknown.\n\n"+
			"Retry after `Retry-After` seconds with the same `Idempotency-Key`: the retry gets the first answer if the work was done, "+
			"and does it if not.")
	RequestTimeout = define("request_timeout", []int{503}, "The request did not finish in time",
		"The request's work did not finish within the server's time limit (`IDEMPOTENCY_TX_TIMEOUT`) and was rolled back.\n\n"+
			"Nothing was done. Retry with the same `Idempotency-Key`.")
	NotReady = define("not_ready", []int{503}, "Not ready",
		"The readiness probe (`/readyz`) failed: the process cannot serve yet, or no longer can. `detail` says what is missing.\n\n"+
			"A load balancer should send requests elsewhere; an operator should look at the process's logs.")
	InternalError = define("internal_error", []int{500}, "Internal error",
		"The server failed in a way it did not expect. Nothing was done, and nothing was stored against the `Idempotency-Key`.\n\n"+
			"Retry the request with the same key. If it keeps failing, report it with the answer's `request_id`.")
)
