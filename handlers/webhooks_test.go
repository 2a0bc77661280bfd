package handlers_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/webhooks"
)

func TestWebhookEndpoints(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	acme, other := e.NewOrg("Acme"), e.NewOrg("Other")

	r := e.Do(http.MethodPost, "/api/webhook-endpoints/", acme.Token,
		`{"url":"https://example.com/hooks","description":"invoices","events":["validation_run.finished"]}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	var created handlers.WebhookEndpointWithSecret
	r.JSON(t, &created)
	require.NoError(t, uuid.Validate(created.ID))
	require.Equal(t, "/api/webhook-endpoints/"+created.ID+"/", r.Header.Get("Location"))
	require.Equal(t, "https://example.com/hooks", created.URL)
	require.Equal(t, "invoices", created.Description)
	require.Equal(t, []string{"validation_run.finished"}, created.Events)
	require.WithinDuration(t, time.Now(), created.CreatedAt, time.Hour)
	require.Nil(t, created.PreviousSecretExpiresAt)
	require.True(t, strings.HasPrefix(created.Secret, "whsec_"), created.Secret)
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(created.Secret, "whsec_"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(key), 24, "a secret holds at least 24 random bytes")

	// The secret is shown only when it is made.
	g := e.Do(http.MethodGet, r.Header.Get("Location"), acme.Token, nil)
	require.Equal(t, http.StatusOK, g.Status, "%s", g.Body)
	require.NotContains(t, g.Map(t), "secret")
	var read handlers.WebhookEndpoint
	g.JSON(t, &read)
	require.Equal(t, created.WebhookEndpoint, read)
	l := e.Do(http.MethodGet, "/api/webhook-endpoints/", acme.Token, nil)
	require.Equal(t, http.StatusOK, l.Status, "%s", l.Body)
	require.NotContains(t, string(l.Body), created.Secret)
	var list handlers.WebhookEndpointList
	l.JSON(t, &list)
	require.Equal(t, []handlers.WebhookEndpoint{read}, list.Data)

	// Events left out: all of them.
	r2 := e.Do(http.MethodPost, "/api/webhook-endpoints", acme.Token, `{"url":"http://example.com:8080/x"}`)
	require.Equal(t, http.StatusCreated, r2.Status, "%s", r2.Body)
	require.Equal(t, []any{"validation_run.finished"}, r2.Map(t)["events"])
	require.NotEqual(t, created.Secret, r2.Map(t)["secret"], "every endpoint has its own secret")

	// Another organisation sees none of it, and cannot touch it.
	path := "/api/webhook-endpoints/" + created.ID + "/"
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, path}, {http.MethodDelete, path}, {http.MethodPost, path + "rotate-secret/"},
	} {
		o := e.Do(c.method, c.path, other.Token, nil)
		require.Equal(t, http.StatusNotFound, o.Status, "%s %s: %s", c.method, c.path, o.Body)
		require.Equal(t, "not_found", o.Map(t)["code"])
	}
	ol := e.Do(http.MethodGet, "/api/webhook-endpoints/", other.Token, nil)
	require.Equal(t, http.StatusOK, ol.Status)
	require.Equal(t, []any{}, ol.Map(t)["data"])

	// Rotation: a new secret; the old one signs beside it for 24 h.
	rot := e.Do(http.MethodPost, path+"rotate-secret/", acme.Token, nil)
	require.Equal(t, http.StatusOK, rot.Status, "%s", rot.Body)
	var rotated handlers.WebhookEndpointWithSecret
	rot.JSON(t, &rotated)
	require.NotEqual(t, created.Secret, rotated.Secret)
	require.True(t, strings.HasPrefix(rotated.Secret, "whsec_"))
	require.NotNil(t, rotated.PreviousSecretExpiresAt)
	require.WithinDuration(t, time.Now().Add(24*time.Hour), *rotated.PreviousSecretExpiresAt, time.Hour)
	stored, err := models.NewWebhookStore(e.DB).Get(context.Background(), acme.ID, created.ID)
	require.NoError(t, err)
	require.Equal(t, []string{rotated.Secret, created.Secret}, stored.SigningSecrets(time.Now()), "both sign during the overlap")
	require.Equal(t, []string{rotated.Secret}, stored.SigningSecrets(time.Now().Add(24*time.Hour+time.Minute)), "only the new one after it")
	// Rotating again ends the first overlap at once: the one rotated out now overlaps.
	rot2 := e.Do(http.MethodPost, path+"rotate-secret/", acme.Token, nil)
	require.Equal(t, http.StatusOK, rot2.Status, "%s", rot2.Body)
	stored, err = models.NewWebhookStore(e.DB).Get(context.Background(), acme.ID, created.ID)
	require.NoError(t, err)
	require.Equal(t, []string{rot2.Map(t)["secret"].(string), rotated.Secret}, stored.SigningSecrets(time.Now()))

	// Delete: gone, and a second delete is a 404.
	d := e.Do(http.MethodDelete, path, acme.Token, nil)
	require.Equal(t, http.StatusNoContent, d.Status, "%s", d.Body)
	require.Empty(t, d.Body)
	require.Equal(t, http.StatusNotFound, e.Do(http.MethodGet, path, acme.Token, nil).Status)
	require.Equal(t, http.StatusNotFound, e.Do(http.MethodDelete, path, acme.Token, nil).Status)
	require.Equal(t, http.StatusNotFound, e.Do(http.MethodGet, "/api/webhook-endpoints/hooks/", acme.Token, nil).Status)
}

func TestWebhookEndpointCreateIsIdempotent(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("Acme")
	body := `{"url":"https://example.com/hooks"}`
	first := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, body, idempotency.HeaderKey, "hook-1")
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	again := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, ` { "url" : "https://example.com/hooks" } `, idempotency.HeaderKey, "hook-1")
	require.Equal(t, http.StatusCreated, again.Status, "%s", again.Body)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, string(first.Body), string(again.Body), "the first answer, byte for byte")
	require.EqualValues(t, 1, e.Count("webhook_endpoints", "org_id = ?", org.ID))
	reused := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, `{"url":"https://example.com/other"}`, idempotency.HeaderKey, "hook-1")
	require.Equal(t, http.StatusUnprocessableEntity, reused.Status, "%s", reused.Body)
	require.Equal(t, "idempotency_key_reused", reused.Map(t)["code"])
	k := e.Do(http.MethodGet, "/api/idempotency-keys/"+handlers.ScopeWebhookCreate+"/hook-1", org.Token, nil)
	require.Equal(t, http.StatusOK, k.Status, "%s", k.Body)
}

// A rotation retried with its Idempotency-Key gets the first answer (the
// same new secret) and rotates once: the secret the receivers still use
// keeps signing. Without the key, the retry would rotate again and drop it.
func TestWebhookRotationIsIdempotent(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("Acme")
	c := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, `{"url":"https://example.com/hooks"}`)
	require.Equal(t, http.StatusCreated, c.Status, "%s", c.Body)
	var created handlers.WebhookEndpointWithSecret
	c.JSON(t, &created)
	path := "/api/webhook-endpoints/" + created.ID + "/rotate-secret/"

	first := e.Do(http.MethodPost, path, org.Token, nil, idempotency.HeaderKey, "rotate-1")
	require.Equal(t, http.StatusOK, first.Status, "%s", first.Body)
	again := e.Do(http.MethodPost, path, org.Token, nil, idempotency.HeaderKey, "rotate-1")
	require.Equal(t, http.StatusOK, again.Status, "%s", again.Body)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, string(first.Body), string(again.Body), "the first answer, byte for byte")
	var rotated handlers.WebhookEndpointWithSecret
	first.JSON(t, &rotated)
	stored, err := models.NewWebhookStore(e.DB).Get(context.Background(), org.ID, created.ID)
	require.NoError(t, err)
	require.Equal(t, []string{rotated.Secret, created.Secret}, stored.SigningSecrets(time.Now()),
		"rotated once: the original secret still signs beside the new one")

	// The same key on another endpoint is another request.
	c2 := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, `{"url":"https://example.com/other"}`)
	require.Equal(t, http.StatusCreated, c2.Status, "%s", c2.Body)
	other := c2.Map(t)["id"].(string)
	reused := e.Do(http.MethodPost, "/api/webhook-endpoints/"+other+"/rotate-secret/", org.Token, nil, idempotency.HeaderKey, "rotate-1")
	require.Equal(t, http.StatusUnprocessableEntity, reused.Status, "%s", reused.Body)
	k := e.Do(http.MethodGet, "/api/idempotency-keys/"+handlers.ScopeWebhookRotate+"/rotate-1", org.Token, nil)
	require.Equal(t, http.StatusOK, k.Status, "%s", k.Body)
}

func TestWebhookEndpointValidation(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("Acme")
	for _, tt := range []struct{ name, body, field string }{
		{"no url", `{"description":"x"}`, "url"},
		{"ftp", `{"url":"ftp://example.com/"}`, "url"},
		{"relative", `{"url":"/hooks"}`, "url"},
		{"user information", `{"url":"https://u:p@example.com/"}`, "url"},
		{"too long", `{"url":"https://example.com/` + strings.Repeat("a", 2048) + `"}`, "url"},
		{"loopback", `{"url":"http://127.0.0.1:18500/"}`, "url"},
		{"localhost", `{"url":"https://localhost/"}`, "url"},
		{"private", `{"url":"http://10.0.0.8/"}`, "url"},
		{"metadata", `{"url":"http://169.254.169.254/latest/meta-data/"}`, "url"},
		{"ipv6 loopback", `{"url":"http://[::1]/"}`, "url"},
		{"localhost.localdomain", `{"url":"http://localhost.localdomain:18998/h"}`, "url"},
		{"ip6-localhost", `{"url":"http://ip6-localhost:18998/h"}`, "url"},
		{"ipv4-compatible", `{"url":"http://[::127.0.0.1]:18998/h"}`, "url"},
		{"ipv4-compatible hex", `{"url":"http://[::7f00:1]:18998/h"}`, "url"},
		{"6to4", `{"url":"http://[2002:7f00:1::]:18998/h"}`, "url"},
		{"teredo", `{"url":"http://[2001:0:7f00:1::]:18998/h"}`, "url"},
		{"local-use nat64", `{"url":"http://[64:ff9b:1::7f00:1]:18998/h"}`, "url"},
		{"6to4 relay", `{"url":"http://192.88.99.1/h"}`, "url"},
		{"full-width loopback", `{"url":"http://１２７.０.０.１:18998/h"}`, "url"},
		{"ideographic full stops", `{"url":"http://127。0。0。1:18998/h"}`, "url"},
		{"documentation range", `{"url":"http://203.0.113.9/h"}`, "url"},
		{"ipv6 documentation range", `{"url":"http://[2001:db8::1]/h"}`, "url"},
		{"site-local", `{"url":"http://[fec0::1]/h"}`, "url"},
		{"two final dots", `{"url":"http://example.com../h"}`, "url"},
		{"long description", `{"url":"https://example.com/","description":"` + strings.Repeat("é", 501) + `"}`, "description"},
		{"unknown event", `{"url":"https://example.com/","events":["validation_run.started"]}`, "events[0]"},
		{"no events", `{"url":"https://example.com/","events":[]}`, "events"},
		{"unknown member", `{"url":"https://example.com/","secret":"whsec_x"}`, "secret"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, tt.body)
			require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)
			m := r.Map(t)
			require.Equal(t, "validation_error", m["code"])
			require.Contains(t, string(r.Body), `"field":"`+tt.field+`"`)
		})
	}
	require.EqualValues(t, 0, e.Count("webhook_endpoints", "org_id = ?", org.ID))

	// The refusal names the host as it would be dialled, and why.
	r := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, `{"url":"http://１２７.０.０.１:18998/h"}`)
	require.Equal(t, "url: address not allowed: 127.0.0.1 (written １２７.０.０.１) is a loopback address.", r.Map(t)["detail"])

	// With WEBHOOK_ALLOW_PRIVATE_TARGETS=true (local development), private targets are taken.
	dev := e.WithConfig(func(c *config.Config) { c.WebhookAllowPrivateTargets = true })
	r = dev.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, `{"url":"http://127.0.0.1:18500/hooks"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)

	// A URL that can never be valid is refused even then: an IPv4 address
	// not in dotted-decimal form (resolvers read these as addresses), a
	// port out of range.
	for _, url := range []string{"http://0x7f000001:18998/h", "http://2130706433:18998/h", "http://0177.0.0.1:18998/h",
		"http://127.1:18998/h", "http://0:18998/h", "http://127.0.0.1:0/h", "http://127.0.0.1:99999/h", "http://example.com:0/h",
		"http://１２７.１:18998/h", "http://127.0.0.1..:18998/h"} {
		for _, env := range []*apitest.Env{e, dev} {
			r := env.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, map[string]any{"url": url})
			require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", url, r.Body)
			m := r.Map(t)
			require.Equal(t, "validation_error", m["code"], url)
			require.Contains(t, string(r.Body), `"field":"url"`, url)
			require.Contains(t, m["detail"], "url: ", url)
		}
	}
	require.EqualValues(t, 1, e.Count("webhook_endpoints", "org_id = ?", org.ID))
}

// A run that ends records its event for each endpoint of its organisation,
// visible in the endpoint's deliveries: pending, with the event id the
// deliveries will carry as webhook-id. Another organisation's endpoint is a
// 404, and an endpoint made after the run ended hears nothing of it.
func TestWebhookDeliveriesList(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org, other := e.NewOrg("Acme"), e.NewOrg("Other")
	hook := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, `{"url":"https://example.com/hooks"}`)
	require.Equal(t, http.StatusCreated, hook.Status, "%s", hook.Body)
	path := "/api/webhook-endpoints/" + hook.Map(t)["id"].(string) + "/deliveries/"

	empty := e.Do(http.MethodGet, path, org.Token, nil)
	require.Equal(t, http.StatusOK, empty.Status, "%s", empty.Body)
	require.Equal(t, []any{}, empty.Map(t)["data"])

	wf := e.NewWorkflow(org, exWorkflowBody)
	r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", org.Token, exStartBody)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	run := r.Map(t)["id"].(string)
	require.Equal(t, models.RunPassed, exExecute(t, e, run))

	late := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, `{"url":"https://example.com/late"}`)
	require.Equal(t, http.StatusCreated, late.Status, "%s", late.Body)

	l := e.Do(http.MethodGet, path, org.Token, nil)
	require.Equal(t, http.StatusOK, l.Status, "%s", l.Body)
	var list handlers.WebhookDeliveryList
	l.JSON(t, &list)
	require.Len(t, list.Data, 1)
	d := list.Data[0]
	require.Equal(t, "evt_"+strings.ReplaceAll(run, "-", ""), d.EventID)
	require.Equal(t, run, *d.RunID)
	require.Equal(t, "validation_run.finished", d.EventType)
	require.Equal(t, "pending", d.Status)
	require.Zero(t, d.Attempts)
	require.NotNil(t, d.NextAttemptAt)

	// A last_error recorded with addresses in it (as before reasons were
	// coarse) is shown as a coarse reason; a coarse one as it is.
	for recorded, shown := range map[string]string{
		"dial tcp 10.0.0.1:18998: private address: 10.0.0.1":                                webhooks.ReasonFailed,
		`Post "http://0x7f000001:18998/h": dial tcp: lookup 0x7f000001 on 10.255.255.53:53`: webhooks.ReasonFailed,
		"answered 503":                    "answered 503",
		webhooks.ReasonUnresolved:         webhooks.ReasonUnresolved,
		"answered 503 from 10.0.0.1:8080": webhooks.ReasonFailed,
	} {
		require.NoError(t, e.DB.Exec(`UPDATE webhook_deliveries SET last_error = ? WHERE run_id = ?`, recorded, run).Error)
		l := e.Do(http.MethodGet, path, org.Token, nil)
		require.Equal(t, http.StatusOK, l.Status, "%s", l.Body)
		var list handlers.WebhookDeliveryList
		l.JSON(t, &list)
		require.NotNil(t, list.Data[0].LastError)
		require.Equal(t, shown, *list.Data[0].LastError, recorded)
	}

	ll := e.Do(http.MethodGet, "/api/webhook-endpoints/"+late.Map(t)["id"].(string)+"/deliveries/", org.Token, nil)
	require.Equal(t, http.StatusOK, ll.Status, "%s", ll.Body)
	require.Equal(t, []any{}, ll.Map(t)["data"], "an endpoint made after the run ended")

	o := e.Do(http.MethodGet, path, other.Token, nil)
	require.Equal(t, http.StatusNotFound, o.Status, "%s", o.Body)
	require.Equal(t, http.StatusNotFound, e.Do(http.MethodGet, "/api/webhook-endpoints/x/deliveries/", org.Token, nil).Status)
}
