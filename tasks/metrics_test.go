package tasks_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/tasks"
)

// A worker exports valruns_tasks_processed_total and
// valruns_tasks_failed_total for every task type from its start, at 0,
// before any task ran: the dashboard's rate of failures and the backlog
// alert's advice read them, and a series that appears with its first
// event has no rate for that event.
func TestTaskCountersExportedFromTheStart(t *testing.T) {
	t.Parallel()
	env := apitest.New(t)
	w := newWorker(t, env, newRedis(t), nil)
	mfs, err := w.Registry.Gather()
	require.NoError(t, err)
	got := map[string][]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "type" {
					require.Zero(t, m.GetCounter().GetValue())
					got[mf.GetName()] = append(got[mf.GetName()], l.GetValue())
				}
			}
		}
	}
	types := []string{tasks.TypeRunExecute, tasks.TypeRunBatch, tasks.TypeCleanup, tasks.TypeWebhookDeliver}
	require.ElementsMatch(t, types, got["valruns_tasks_processed_total"])
	require.ElementsMatch(t, types, got["valruns_tasks_failed_total"])
}
