package handlers_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
)

// waitingGauge reads valruns_idempotency_waiting: the requests waiting on a
// key in flight.
func waitingGauge(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range families {
		if mf.GetName() == "valruns_idempotency_waiting" {
			return int(mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	t.Fatal("no valruns_idempotency_waiting metric")
	return 0
}

// requireWaitingCount waits until n requests wait on keys in flight, failing
// at once if one of answered has already been answered (it did not wait).
// 30 s is a bound on a loaded machine, not what is checked.
func requireWaitingCount(t *testing.T, reg *prometheus.Registry, n int, answered ...<-chan apitest.Response) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for waitingGauge(t, reg) != n {
		for _, ch := range answered {
			select {
			case r := <-ch:
				t.Fatalf("answered %d instead of waiting: %s", r.Status, r.Body)
			default:
			}
		}
		require.True(t, time.Now().Before(deadline), "timed out: %d requests waiting, want %d", waitingGauge(t, reg), n)
		time.Sleep(10 * time.Millisecond)
	}
}

// A Prefer: wait too large for a duration (its seconds overflow int64
// nanoseconds, or int64 itself) waits the cap, IDEMPOTENCY_MAX_WAIT, as
// any value above the cap does. They waited 0 s (a 409 at once) or 0.29 s.
// The cap is 60 s here and the key's holder lets go once the request is
// seen waiting: the waiter then executes, and says it applied the cap.
func TestPreferWaitAboveTheCapWaitsTheCap(t *testing.T) {
	t.Parallel()
	f := newIdemFixture(t, func(c *config.Config) { c.IdempotencyMaxWait = time.Minute })
	for i, wait := range []string{"61", "9223372037", "9223372036854775807", "18446744074",
		"18446744073709551616", "99999999999999999999999999"} {
		t.Run(wait, func(t *testing.T) {
			key := fmt.Sprintf("overflow-%d", i)
			release := idemHoldKeyLock(t, f.e, f.org.ID, "workflow_start", key)
			w := waitFor(func() apitest.Response { return f.start(idemBody, idemKey(key, "Prefer", "wait="+wait)...) })
			requireWaitingCount(t, f.e.Registry, 1, w)
			release() // the holder rolled back: the waiter executes
			r := <-w
			requireExecuted(t, r)
			require.Equal(t, "wait=60", r.Header.Get(idempotency.HeaderPreferenceApplied), "the wait applied: the cap")
			require.Zero(t, waitingGauge(t, f.e.Registry))
		})
	}
}

// One organisation cannot use up Prefer: wait for the others: with
// IDEMPOTENCY_MAX_WAITERS=8, an organisation holds at most a quarter of the
// slots, and an organisation with no request waiting gets one even when
// the others hold every slot. Here four organisations each send 8 waiters
// (2 of each wait, the rest get 409 at once: all 8 slots are taken), and a
// fifth's Prefer: wait on its own key in flight still waits and gets the
// answer. Before, the first organisation's 8 waiters took every slot.
func TestPreferWaitFairSharePerOrganisation(t *testing.T) {
	t.Parallel()
	e := apitest.New(t, apitest.Options{Config: func(c *config.Config) {
		c.IdempotencyMaxWaiters = 8
		c.IdempotencyMaxWait = time.Minute
	}})
	type tenant struct {
		org apitest.Org
		wf  string
	}
	newTenant := func(name string) tenant {
		org := e.NewOrg(name)
		return tenant{org, e.NewWorkflow(org, idemWorkflowBody)}
	}
	send := func(tn tenant, key string) <-chan apitest.Response {
		return waitFor(func() apitest.Response {
			return e.Do(http.MethodPost, idemStartPath(tn.wf), tn.org.Token, idemBody, idemKey(key, "Prefer", "wait=60")...)
		})
	}

	var waiting []<-chan apitest.Response
	var refused int
	for i := range 4 {
		tn := newTenant(fmt.Sprintf("greedy-%d", i))
		defer idemHoldKeyLock(t, e, tn.org.ID, "workflow_start", "hot")()
		var sent []<-chan apitest.Response
		for range 8 {
			sent = append(sent, send(tn, "hot"))
		}
		// Each is either waiting or answered 409 at once: count both.
		apitest.Eventually(t, 30*time.Second, func() bool {
			for j := 0; j < len(sent); j++ {
				select {
				case r := <-sent[j]:
					require.Equal(t, http.StatusConflict, r.Status, "%s", r.Body)
					refused++
					sent = append(sent[:j], sent[j+1:]...)
					j--
				default:
				}
			}
			return len(waiting)+len(sent)+refused == 8*(i+1) && waitingGauge(t, e.Registry) == len(waiting)+len(sent)
		}, "every request of the organisation waiting or refused")
		require.LessOrEqual(t, len(sent), 2, "an organisation holds at most a quarter of the 8 slots")
		waiting = append(waiting, sent...)
	}
	require.Equal(t, 8, waitingGauge(t, e.Registry), "the four organisations hold every slot")

	other := newTenant("other")
	release := idemHoldKeyLock(t, e, other.org.ID, "workflow_start", "own")
	w := send(other, "own")
	requireWaitingCount(t, e.Registry, 9, w)
	release()
	r := <-w
	requireExecuted(t, r)
	require.Equal(t, "wait=60", r.Header.Get(idempotency.HeaderPreferenceApplied))
}
