package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
)

// Fingerprint identifies a request by its method, path and canonical body
// (as returned by canonjson.Canonicalize; nil for no body), so that a key
// reused for a different request can be told apart. Each part is length-prefixed, so no
// two different triples hash the same input by concatenation, and the input
// starts with a versioned domain tag, so a future change of the scheme
// cannot match fingerprints stored by this one.
func Fingerprint(method, path string, canonicalBody []byte) [32]byte {
	h := sha256.New()
	var n [8]byte
	writePart := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	h.Write([]byte("valruns idempotency fingerprint v1\x00"))
	writePart([]byte(method))
	writePart([]byte(path))
	writePart(canonicalBody)
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}
