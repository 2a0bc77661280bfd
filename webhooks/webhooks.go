// Package webhooks holds what valruns' webhooks need besides the database:
// the Standard Webhooks signature (https://www.standardwebhooks.com/) and
// the policy on which targets a delivery may reach (SSRF), and the sender.
// It uses no database.
package webhooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
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
// reserved, documentation, unspecified, multicast or cloud metadata address,
// an address of this host, or a name for the local host, and private
// targets are not allowed.
var ErrPrivateTarget = errors.New("address not allowed")

// PublicAddr reports whether a may be the target of a delivery when private
// targets are not allowed: the one list both CheckURL (when an endpoint is
// registered) and the Sender (on the address being dialled) apply.
func PublicAddr(a netip.Addr) bool { return refusal(a) == "" }

// refusal says why a may not be the target of a delivery ("a loopback
// address"), or is "" when it may.
func refusal(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return "not an address"
	case a.IsLoopback():
		return "a loopback address"
	case a.IsPrivate():
		return "a private address"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "a link-local address"
	case a.IsInterfaceLocalMulticast(), a.IsMulticast():
		return "a multicast address"
	case a.IsUnspecified():
		return "the unspecified address"
	}
	for _, r := range refused {
		if r.prefix.Contains(a) {
			return r.what + " (" + r.prefix.String() + ")"
		}
	}
	own, err := interfaceAddrs()
	if err != nil {
		return "not known to be public: this host's addresses could not be read"
	}
	for _, o := range own {
		if n, ok := o.(*net.IPNet); ok {
			if oa, ok := netip.AddrFromSlice(n.IP); ok && oa.Unmap() == a.WithZone("") {
				return "an address of this host"
			}
		}
	}
	return ""
}

// interfaceAddrs lists this host's interface addresses: a public address
// of the host reaches its own services as loopback would. Read at each
// check, since addresses change while a process runs; a variable so that
// tests can give the host a public address.
var interfaceAddrs = net.InterfaceAddrs

// refused are the ranges the net/netip predicates leave out, from the IANA
// special-purpose address registries: none is a host on the internet a
// delivery could be meant for. The IPv6 ranges that embed or reach an IPv4
// address of any kind are here so that 127.0.0.1 cannot hide in them.
var refused = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), `a "this network" address`},
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared address (carrier-grade NAT)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an address reserved for protocol assignments"},
	{netip.MustParsePrefix("192.0.2.0/24"), "a documentation address"},
	{netip.MustParsePrefix("192.88.99.0/24"), "the 6to4 relay anycast address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("198.51.100.0/24"), "a documentation address"},
	{netip.MustParsePrefix("203.0.113.0/24"), "a documentation address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved address"},
	{netip.MustParsePrefix("fd00:ec2::/32"), "a cloud metadata service address"},
	{netip.MustParsePrefix("::/96"), "an IPv4-compatible address"},
	{netip.MustParsePrefix("::ffff:0:0:0/96"), "an IPv4-translated address"},
	{netip.MustParsePrefix("64:ff9b::/96"), "a NAT64 address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a local-use NAT64 address"},
	{netip.MustParsePrefix("100::/64"), "a discard-only address"},
	{netip.MustParsePrefix("2001::/32"), "a Teredo address"},
	{netip.MustParsePrefix("2001:2::/48"), "a benchmarking address"},
	{netip.MustParsePrefix("2001:db8::/32"), "a documentation address"},
	{netip.MustParsePrefix("2002::/16"), "a 6to4 address"},
	{netip.MustParsePrefix("3fff::/20"), "a documentation address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address (deprecated)"},
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
// address as written by RFC 3986. The host is checked as net/http dials
// it: a host that is not ASCII is first mapped by UTS 46 (idna.Lookup, as
// net/http does), so "１２７.０.０.１" and "127。0。0。1" are 127.0.0.1. A name
// must be one a resolver takes (labels of letters, digits, hyphens and
// underscores, none empty: no "example.com.."); one that ends in a number
// must be an IPv4 address in dotted-decimal form, since resolvers and
// browsers read 0x7f000001, 2130706433, 0177.0.0.1, 127.1 and 0 as
// addresses too. Unless allowPrivate, a host that is an address must be a
// public one (PublicAddr) and a name must not be the local host's; a name
// is resolved only when a delivery is sent, and checked again then (a name
// may resolve anywhere).
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
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %s is not a port number (1 to 65535)", p)
		}
	}
	host, shown, err := dialledHost(u)
	if err != nil {
		return err
	}
	a, err := netip.ParseAddr(host)
	isAddr := err == nil
	if !isAddr && endsInNumber(host) {
		return fmt.Errorf("host %s: an IPv4 address must be written as four decimal numbers (such as 192.0.2.1)", shown)
	}
	if !isAddr && !hostName(host) {
		return fmt.Errorf("host %s is not a host name: labels of letters, digits, hyphens and underscores, "+
			"none empty, at most 63 bytes each and 253 in all", shown)
	}
	switch {
	case allowPrivate:
		return nil
	case isAddr:
		if why := refusal(a); why != "" {
			return fmt.Errorf("%w: %s is %s", ErrPrivateTarget, shown, why)
		}
		return nil
	case host == "localhost" || strings.HasSuffix(host, ".localhost") || localNames[host]:
		return fmt.Errorf("%w: %s names a local or metadata host", ErrPrivateTarget, shown)
	}
	return nil
}

// dialledHost returns u's host as net/http dials it, lower case and
// without one final dot: mapped by UTS 46 when it is not ASCII (net/http's
// idnaASCII), an IPv6 address when written in brackets. shown is how a
// message names it: the dialled host, and the host as written when they
// differ by more than case.
func dialledHost(u *url.URL) (host, shown string, err error) {
	written := u.Hostname()
	if strings.HasPrefix(u.Host, "[") {
		a, err := netip.ParseAddr(written)
		if err != nil || !a.Is6() {
			return "", "", fmt.Errorf("host [%s] is not an IPv6 address", written)
		}
		return written, written, nil
	}
	host = written
	if !isASCII(host) {
		if host, err = idna.Lookup.ToASCII(host); err != nil {
			return "", "", fmt.Errorf("host %s is not a host name (%v)", written, err)
		}
	}
	host = strings.ToLower(host)
	shown = host
	if !strings.EqualFold(host, written) {
		shown = host + " (written " + written + ")"
	}
	return strings.TrimSuffix(host, "."), shown, nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// hostName reports whether host (lower case, without its final dot) is a
// name a resolver takes: labels of 1 to 63 letters, digits, hyphens and
// underscores, no label starting or ending with a hyphen, 253 bytes in all
// (the rules of Go's resolver).
func hostName(host string) bool {
	if host == "" || len(host) > 253 {
		return false
	}
	for label := range strings.SplitSeq(host, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' ||
			strings.Trim(label, "abcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			return false
		}
	}
	return true
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
