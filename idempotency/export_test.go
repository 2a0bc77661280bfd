package idempotency

import "time"

// Hooks for the package's tests into the cache of answers (answerCache).
// Each is applied to a Wrapper before it serves a request.

// AnswerCacheMaxAge and AnswerCacheSkew are the cache's bounds in time.
const (
	AnswerCacheMaxAge = answerCacheMaxAge
	AnswerCacheSkew   = answerCacheSkew
)

// WithoutAnswerCache turns w's cache of answers off: every replay then
// reads the database. For the tests that expire or delete a key's row by
// SQL and retry through the same wrapper at once: the cache trusts the
// expires_at it was told, and for it no time passed.
func WithoutAnswerCache[T Tx](w *Wrapper[T]) { w.answers = nil }

// SetAnswerClock makes w's cache read the time from now.
func SetAnswerClock[T Tx](w *Wrapper[T], now func() time.Time) { w.answers.now = now }

// SetAnswerBounds sets w's cache's bounds: entries, bytes, and the largest
// entry it takes.
func SetAnswerBounds[T Tx](w *Wrapper[T], entries, bytes, maxAnswer int) {
	w.answers.maxEntries, w.answers.maxBytes, w.answers.maxAnswer = entries, bytes, maxAnswer
}

// AnswerCacheHolds is how many entries and bytes w's cache holds.
func AnswerCacheHolds[T Tx](w *Wrapper[T]) (entries, bytes int) {
	return w.answers.len(), w.answers.size()
}
