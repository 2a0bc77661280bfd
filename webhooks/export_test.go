package webhooks

import (
	"net"
	"net/netip"
	"testing"
)

// CheckDial is the Sender's check of the address it is about to dial.
var CheckDial = checkDial

// SetHostAddrs makes addrs this host's interface addresses, besides its
// real ones, until t ends. A test that calls it must not be parallel.
func SetHostAddrs(t *testing.T, addrs ...string) {
	t.Helper()
	real := interfaceAddrs
	t.Cleanup(func() { interfaceAddrs = real })
	interfaceAddrs = func() ([]net.Addr, error) {
		own, err := real()
		for _, s := range addrs {
			a := netip.MustParseAddr(s)
			own = append(own, &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())})
		}
		return own, err
	}
}
