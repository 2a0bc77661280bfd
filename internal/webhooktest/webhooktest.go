// Package webhooktest holds the Standard Webhooks specification's published
// test vector (https://github.com/standard-webhooks/standard-webhooks,
// spec/standard-webhooks.md), for the tests of both sides: the server's
// signing (package webhooks) and the client's verification
// (client.VerifyWebhook). Matching it is what lets receivers verify
// valruns' deliveries with any of the specification's libraries.
package webhooktest

// The vector: a delivery of Body with webhook-id ID and webhook-timestamp
// Timestamp, signed with Secret, carries webhook-signature Signature.
const (
	Secret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	ID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	Timestamp = 1614265330
	Body      = `{"test": 2432232314}`
	Signature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

// OtherSecret is a second secret, for a signature made while one rotated
// out still overlaps the new one.
const OtherSecret = "whsec_c2VjcmV0LW9mLWEtcm90YXRlZC1lbmRwb2ludA=="
