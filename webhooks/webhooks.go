// Package webhooks holds what valruns' webhooks need besides the database:
// the Standard Webhooks signature (https://www.standardwebhooks.com/) and
// the policy on which targets a delivery may reach (SSRF). It is pure: no
// database, no network.
package webhooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// EventRunFinished is the one event type: a run reached passed, failed or error.
const EventRunFinished = "validation_run.finished"

// EventTypes are the event types an endpoint may subscribe to.
var EventTypes = []string{EventRunFinished}

// MaxURLLength bounds an endpoint's URL, in bytes.
const MaxURLLength = 2048

// secretPrefix starts every signing secret.
const secretPrefix = "whsec_"

// DecodeSecret returns the key bytes of a "whsec_" + base64 secret.
func DecodeSecret(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, secretPrefix))
	if err != nil {
		return nil, fmt.Errorf("webhook secret: %w", err)
	}
	return key, nil
}

// Sign returns the value of the webhook-signature header for a delivery of
// body with that webhook-id and webhook-timestamp: "v1," + base64 of
// HMAC-SHA256(key, id.timestamp.body) per secret, space-separated (two
// secrets sign while a rotated-out one overlaps the new one).
func Sign(secrets []string, id string, timestamp int64, body []byte) (string, error) {
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		key, err := DecodeSecret(s)
		if err != nil {
			return "", err
		}
		m := hmac.New(sha256.New, key)
		m.Write([]byte(id))
		m.Write([]byte{'.'})
		m.Write([]byte(strconv.FormatInt(timestamp, 10)))
		m.Write([]byte{'.'})
		m.Write(body)
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)))
	}
	return strings.Join(sigs, " "), nil
}

// ErrPrivateTarget: the target is a loopback, private, link-local,
// unspecified, multicast or cloud metadata address (or a name for the
// local host), and private targets are not allowed.
var ErrPrivateTarget = errors.New("private address")

// PublicAddr reports whether a may be the target of a delivery when private
// targets are not allowed.
func PublicAddr(a netip.Addr) bool {
	a = a.Unmap()
	switch {
	case !a.IsValid(), a.IsLoopback(), a.IsPrivate(), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast(),
		a.IsInterfaceLocalMulticast(), a.IsMulticast(), a.IsUnspecified():
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// nonPublic are ranges the net/netip predicates leave out: shared address
// space (carrier NAT), "this network", benchmarking, the AWS/GCP/Azure
// metadata service's IPv6 form and NAT64's well-known prefix (which embeds
// an IPv4 address of any kind).
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("fd00:ec2::/32"),
	netip.MustParsePrefix("64:ff9b::/96"),
}

// CheckURL checks an endpoint's URL: absolute http or https with a host, at
// most MaxURLLength bytes, no user information (a secret in a URL shows in
// logs). Unless allowPrivate, a host that is an address must be a public
// one and a name must not be the local host's; a name is resolved only when
// a delivery is sent, and checked again then (a name may resolve anywhere).
func CheckURL(raw string, allowPrivate bool) error {
	if raw == "" || len(raw) > MaxURLLength {
		return fmt.Errorf("1 to %d characters", MaxURLLength)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return errors.New("must be an http or https URL")
	}
	if u.Host == "" || u.Hostname() == "" {
		return errors.New("must name a host")
	}
	if u.User != nil {
		return errors.New("must not carry user information")
	}
	if u.Fragment != "" {
		return errors.New("must not carry a fragment")
	}
	if allowPrivate {
		return nil
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if a, err := netip.ParseAddr(host); err == nil {
		if !PublicAddr(a) {
			return fmt.Errorf("%w: %s is not a public address", ErrPrivateTarget, host)
		}
		return nil
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || host == "metadata.google.internal" {
		return fmt.Errorf("%w: %s names a local or metadata host", ErrPrivateTarget, host)
	}
	return nil
}
