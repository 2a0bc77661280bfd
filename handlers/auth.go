package handlers

import (
	"crypto/sha256"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

const principalKey = "principal"

// principalOf returns who the request acts as (set by authenticate).
func principalOf(c *gin.Context) *models.Principal {
	return c.MustGet(principalKey).(*models.Principal)
}

// authenticate maps `Authorization: Bearer <token>` to an organisation.
// Verified tokens are cached for ttl (0: no cache), which saves every
// request a database read; a revoked token stops working within ttl.
//
// A request that carries more than one credential (two Authorization
// headers, or one header listing several, comma-separated) is refused,
// whichever tokens they are: the server never picks one of them.
func authenticate(tokens *models.TokenStore, ttl time.Duration) gin.HandlerFunc {
	cache := &tokenCache{ttl: ttl}
	return func(c *gin.Context) {
		if ambiguousCredentials(c.Request.Header) {
			// 401 rather than RFC 6750's suggested 400: it is the answer
			// every /api/ route documents and every client already
			// treats as "fix the credentials"; the error names the fault.
			c.Header("WWW-Authenticate", `Bearer realm="valruns", error="invalid_request"`)
			problem.Abort(c, http.StatusUnauthorized, problem.Unauthenticated,
				"The request carries more than one credential (several Authorization headers, or one listing several); send exactly one `Authorization: Bearer vr_...`.")
			return
		}
		h := c.GetHeader("Authorization")
		scheme, token, ok := strings.Cut(h, " ")
		if h == "" || !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
			c.Header("WWW-Authenticate", `Bearer realm="valruns"`)
			problem.Abort(c, http.StatusUnauthorized, problem.Unauthenticated,
				"Send an API token as `Authorization: Bearer vr_...`.")
			return
		}
		token = strings.TrimSpace(token)
		p := cache.get(token)
		if p == nil {
			var err error
			p, err = tokens.Authenticate(c.Request.Context(), token)
			switch {
			case errors.Is(err, models.ErrNotFound):
				c.Header("WWW-Authenticate", `Bearer realm="valruns", error="invalid_token"`)
				problem.Abort(c, http.StatusUnauthorized, problem.InvalidToken, "The API token is unknown or revoked.")
				return
			case err != nil:
				unavailable(c, err)
				return
			}
			cache.put(token, p)
		}
		c.Set(principalKey, p)
		// The request's statements take the database's turns in rotation
		// with other organisations' (models.WithTenant).
		c.Request = c.Request.WithContext(models.WithTenant(c.Request.Context(), p.OrgID))
		c.Next()
		if c.Writer.Status() == http.StatusUnauthorized {
			// The token stopped holding (orgGone): ask the database next time.
			cache.forget(token)
		}
	}
}

// orgGoneDetail is the detail of a 401 to a token whose organisation no
// longer exists.
const orgGoneDetail = "The API token is unknown or revoked: its organisation no longer exists."

// orgGone answers a request whose organisation was deleted while its
// token was still trusted from the cache (models.ErrOrgGone): 401
// invalid_token, as the token check answers once it asks the database.
func orgGone(c *gin.Context) {
	c.Header("WWW-Authenticate", `Bearer realm="valruns", error="invalid_token"`)
	problem.Abort(c, http.StatusUnauthorized, problem.InvalidToken, orgGoneDetail)
}

// orgChecked makes h answer models.ErrOrgGone as orgGone does, refused as
// the token check would have refused it: rolled back, nothing stored
// under the key.
func orgChecked(h idempotency.Handler[*models.RequestTx]) idempotency.Handler[*models.RequestTx] {
	return func(tx *models.RequestTx, req idempotency.Request) (idempotency.Response, error) {
		resp, err := h(tx, req)
		if !errors.Is(err, models.ErrOrgGone) {
			return resp, err
		}
		resp = idempotency.Refuse(req, problem.New(http.StatusUnauthorized, problem.InvalidToken, orgGoneDetail))
		resp.Header.Set("WWW-Authenticate", `Bearer realm="valruns", error="invalid_token"`)
		return resp, nil
	}
}

// orgCheckedPrepared is orgChecked for a route done in one step when it
// can: a one-step start never writes a row of the organisation's own (it
// goes to Handle when the workflow is missing), so only Handle meets
// models.ErrOrgGone.
func orgCheckedPrepared(prep idempotency.Preparer[*models.RequestTx]) idempotency.Preparer[*models.RequestTx] {
	return func(req idempotency.Request) (idempotency.Prepared[*models.RequestTx], error) {
		p, err := prep(req)
		if p.Handle != nil {
			p.Handle = orgChecked(p.Handle)
		}
		return p, err
	}
}

// ambiguousCredentials reports whether h holds more than one Authorization
// credential: the field repeated (even empty), or a comma, which no bearer
// token contains (RFC 6750's b64token) but which joins a list of
// credentials when a proxy folds repeated fields into one.
func ambiguousCredentials(h http.Header) bool {
	v := h.Values("Authorization")
	return len(v) > 1 || len(v) == 1 && strings.Contains(v[0], ",")
}

// tokenCache remembers verified tokens by their hash for a short while.
type tokenCache struct {
	ttl time.Duration
	m   sync.Map // [32]byte -> cachedPrincipal
}

type cachedPrincipal struct {
	p       *models.Principal
	expires time.Time
}

func (tc *tokenCache) get(token string) *models.Principal {
	if tc.ttl <= 0 {
		return nil
	}
	v, ok := tc.m.Load(sha256.Sum256([]byte(token)))
	if !ok {
		return nil
	}
	e := v.(cachedPrincipal)
	if time.Now().After(e.expires) {
		tc.m.Delete(sha256.Sum256([]byte(token)))
		return nil
	}
	return e.p
}

func (tc *tokenCache) forget(token string) {
	if tc.ttl > 0 {
		tc.m.Delete(sha256.Sum256([]byte(token)))
	}
}

func (tc *tokenCache) put(token string, p *models.Principal) {
	if tc.ttl <= 0 {
		return
	}
	tc.m.Store(sha256.Sum256([]byte(token)), cachedPrincipal{p: p, expires: time.Now().Add(tc.ttl)})
}
