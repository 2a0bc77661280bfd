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
// space (carrier NAT), "this network", benchmarking, the 6to4 relay
// anycast, the AWS/GCP/Azure metadata service's IPv6 form, and the IPv6
// ranges that embed or reach an IPv4 address of any kind (so 127.0.0.1
// hides in them): IPv4-compatible (::/96), IPv4-translated
// (::ffff:0:0:0/96), NAT64's well-known and local-use prefixes, Teredo
// (2001::/32) and 6to4 (2002::/16).
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.88.99.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("fd00:ec2::/32"),
	netip.MustParsePrefix("::/96"),
	netip.MustParsePrefix("::ffff:0:0:0/96"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("2001::/32"),
	netip.MustParsePrefix("2002::/16"),
}

// localNames are host names of the local host (or a cloud's metadata
// service) in common hosts files and resolvers; "localhost" and every name
// under ".localhost" are refused too.
var localNames = map[string]bool{
	"localhost.localdomain":    true,
	"localhost6":               true,
	"localhost6.localdomain6":  true,
	"ip6-localhost":            true,
	"ip6-loopback":             true,
	"metadata.google.internal": true,
}

// CheckURL checks an endpoint's URL: absolute http or https with a host, at
// most MaxURLLength bytes, no user information (a secret in a URL shows in
// logs), a port (if any) from 1 to 65535, and a host that is a name or an
// address as written by RFC 3986: one that ends in a number must be an
// IPv4 address in dotted-decimal form, since resolvers and browsers read
// 0x7f000001, 2130706433, 0177.0.0.1, 127.1 and 0 as addresses too. Unless
// allowPrivate, a host that is an address must be a public one and a name
// must not be the local host's; a name is resolved only when a delivery is
// sent, and checked again then (a name may resolve anywhere).
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
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if u.Host == "" || host == "" {
		return errors.New("must name a host")
	}
	if u.User != nil {
		return errors.New("must not carry user information")
	}
	if u.Fragment != "" {
		return errors.New("must not carry a fragment")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %s is not a port number (1 to 65535)", p)
		}
	}
	a, err := netip.ParseAddr(host)
	isAddr := err == nil
	if !isAddr && endsInNumber(host) {
		return fmt.Errorf("host %s: an IPv4 address must be written as four decimal numbers (such as 192.0.2.1)", host)
	}
	switch {
	case allowPrivate:
		return nil
	case isAddr:
		if !PublicAddr(a) {
			return fmt.Errorf("%w: %s is not a public address", ErrPrivateTarget, host)
		}
		return nil
	case host == "localhost" || strings.HasSuffix(host, ".localhost") || localNames[host]:
		return fmt.Errorf("%w: %s names a local or metadata host", ErrPrivateTarget, host)
	}
	return nil
}

// endsInNumber reports whether host's last label is a number, decimal or
// 0x hexadecimal: what the WHATWG URL standard parses as an IPv4 address.
func endsInNumber(host string) bool {
	last := host[strings.LastIndexByte(host, '.')+1:]
	if h, ok := strings.CutPrefix(last, "0x"); ok {
		return strings.Trim(h, "0123456789abcdef") == ""
	}
	return last != "" && strings.Trim(last, "0123456789") == ""
}
