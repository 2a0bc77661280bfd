package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/valruns/valruns/client"
)

// Start a run, safe to retry, and wait for its verdict.
func Example() {
	ctx := context.Background()
	c := client.New("http://127.0.0.1:8080", "vr_...", client.WithMaxAttempts(6))

	// One key per logical operation. Keep it (in your database, your job)
	// if the operation must survive a crash: the same key again replays the
	// first answer instead of starting a second run.
	key := client.NewKey()
	res, err := c.StartRun(ctx, "84837afc-...", map[string]any{"customer": "ACME", "total": 42},
		client.WithKey(key), client.WithMetadata(map[string]string{"source": "billing"}), client.WithWait(5*time.Second))
	switch {
	case errors.Is(err, client.ErrQuotaExceeded):
		log.Fatal("monthly quota used up: ", err)
	case errors.Is(err, client.ErrKeyReused):
		log.Fatal("bug: this key was used for another request: ", err)
	case err != nil:
		log.Fatal(err) // *client.Error (a final answer) or *client.RetryError (attempts spent)
	}
	fmt.Println("run", res.Run.ID, "replayed:", res.Replayed, "attempts:", res.Attempts)

	run, err := c.WaitRun(ctx, res.Run.ID, client.WithProgress(func(r client.Run) { fmt.Println(r.Status) }))
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range run.Findings {
		fmt.Println(f.Severity, f.Step, f.Path, f.Message)
	}

	// Every failed run of the organisation, page after page.
	for r, err := range c.ListRuns(ctx, "", client.WithPageSize(100)) {
		if err != nil {
			log.Fatal(err)
		}
		if r.Status == client.StatusFailed {
			fmt.Println(r.ID)
		}
	}
}
