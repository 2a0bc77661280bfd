package models

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
)

// TokenPrefix starts every API token, so a leaked one is recognisable (and
// secret scanners can find it).
const TokenPrefix = "vr_"

// OrgStore creates, lists and finds organisations and sets their quotas.
type OrgStore struct{ db *gorm.DB }

// NewOrgStore returns an OrgStore on db.
func NewOrgStore(db *gorm.DB) *OrgStore { return &OrgStore{db: db} }

// Sentinel errors of organisations and tokens.
var (
	// ErrInvalidName: an organisation's name is 1 to 200 characters.
	ErrInvalidName = errors.New("name must be 1 to 200 characters")
	// ErrInvalidSlug: a slug is what the organizations table accepts.
	ErrInvalidSlug = errors.New("a slug is 1 to 63 lowercase letters, digits and hyphens, starting with a letter or digit")
	// ErrInvalidTokenRef: not a token id, a token, or a prefix of a token's display.
	ErrInvalidTokenRef = errors.New("want a token id (a UUID), a token, or the start of its display prefix (vr_ and at least one more character)")
	// ErrAlreadyRevoked: the token was revoked before.
	ErrAlreadyRevoked = errors.New("token already revoked")
)

// SlugTakenError: another organisation has the slug. It is an ErrConflict.
type SlugTakenError struct{ Slug string }

func (e *SlugTakenError) Error() string { return fmt.Sprintf("slug %q is taken", e.Slug) }

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *SlugTakenError) Unwrap() error { return ErrConflict }

// slugPattern is the organizations.slug CHECK constraint.
var slugPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// CheckSlug returns ErrInvalidSlug, naming slug, when the database would refuse it.
func CheckSlug(slug string) error {
	if !slugPattern.MatchString(slug) {
		return fmt.Errorf("slug %q: %w", slug, ErrInvalidSlug)
	}
	return nil
}

// CheckName returns ErrInvalidName when the database would refuse an
// organisation's name (surrounding spaces do not count).
func CheckName(name string) error {
	if n := len([]rune(strings.TrimSpace(name))); n == 0 || n > 200 {
		return ErrInvalidName
	}
	return nil
}

// Create inserts an organisation named name, with the slug derived from it
// (Slugify; a name it cannot spell is an *UnsluggableError). A taken slug is a *SlugTakenError: never a silent suffix, since
// the caller would then address another organisation than they think.
func (s *OrgStore) Create(ctx context.Context, name string) (*Organization, error) {
	return s.CreateWithSlug(ctx, name, "")
}

// CreateWithSlug inserts an organisation named name with the given slug (""
// derives it from the name). A taken slug is a *SlugTakenError.
func (s *OrgStore) CreateWithSlug(ctx context.Context, name, slug string) (*Organization, error) {
	if err := CheckName(name); err != nil {
		return nil, fmt.Errorf("create organization: %w", err)
	}
	name = strings.TrimSpace(name)
	if slug == "" {
		var err error
		if slug, err = Slugify(name); err != nil {
			return nil, fmt.Errorf("create organization: %w", err)
		}
	}
	if err := CheckSlug(slug); err != nil {
		return nil, fmt.Errorf("create organization: %w", err)
	}
	var org Organization
	res := s.db.WithContext(ctx).Raw(
		`INSERT INTO organizations (name, slug) VALUES (?, ?) ON CONFLICT (slug) DO NOTHING RETURNING *`,
		name, slug).Scan(&org)
	if res.Error != nil {
		return nil, fmt.Errorf("create organization: %w", translate(res.Error))
	}
	if res.RowsAffected == 0 {
		return nil, fmt.Errorf("create organization: %w", &SlugTakenError{Slug: slug})
	}
	return &org, nil
}

// List returns every organisation, oldest first. It is for operators: the
// number of organisations is the operator's own, not a client's input.
func (s *OrgStore) List(ctx context.Context) ([]Organization, error) {
	var orgs []Organization
	if err := s.db.WithContext(ctx).Order("created_at, slug").Find(&orgs).Error; err != nil {
		return nil, fmt.Errorf("list organizations: %w", translate(err))
	}
	return orgs, nil
}

// BySlug finds an organisation by its slug.
func (s *OrgStore) BySlug(ctx context.Context, slug string) (*Organization, error) {
	var org Organization
	if err := s.db.WithContext(ctx).Where("slug = ?", slug).Take(&org).Error; err != nil {
		return nil, fmt.Errorf("organization %q: %w", slug, translate(err))
	}
	return &org, nil
}

// SetQuota sets the organisation's own monthly run quota (nil: the default applies).
func (s *OrgStore) SetQuota(ctx context.Context, orgID string, quota *int64) error {
	return s.set(ctx, orgID, "monthly_run_quota", quota)
}

// SetStartRate sets the organisation's own start rate, in starts per second
// (nil: the default applies, 0: unlimited).
func (s *OrgStore) SetStartRate(ctx context.Context, orgID string, rate *int) error {
	return s.set(ctx, orgID, "start_rate", rate)
}

// SetRunShare sets how many of the organisation's runs may wait in the
// queue at once (nil: the default applies, 0: unlimited).
func (s *OrgStore) SetRunShare(ctx context.Context, orgID string, share *int) error {
	return s.set(ctx, orgID, "run_share", share)
}

// set writes one of an organisation's overrides; column is one of the
// setters' constants, never a caller's input.
func (s *OrgStore) set(ctx context.Context, orgID, column string, value any) error {
	res := s.db.WithContext(ctx).Exec(`UPDATE organizations SET `+column+` = ? WHERE id = ?`, value, orgID)
	if res.Error != nil {
		return fmt.Errorf("set %s: %w", column, translate(res.Error))
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("set %s: %w", column, ErrNotFound)
	}
	return nil
}

// Principal is who a request acts as: a token of an organisation.
type Principal struct {
	OrgID   string
	OrgSlug string
	TokenID string
	// MonthlyRunQuota is the organisation's own quota; nil: the default applies.
	MonthlyRunQuota *int64
	// StartRate and RunShare are the organisation's own limits (starts per
	// second; runs in the queue at once); nil: the default applies, 0: unlimited.
	StartRate, RunShare *int
}

// TokenStore issues and verifies API tokens.
type TokenStore struct{ db *gorm.DB }

// NewTokenStore returns a TokenStore on db.
func NewTokenStore(db *gorm.DB) *TokenStore { return &TokenStore{db: db} }

// HashToken is the SHA-256 stored for a token.
func HashToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// Create issues a new token for the organisation and returns it in clear:
// this is the only time it exists outside the caller's hands.
func (s *TokenStore) Create(ctx context.Context, orgID string) (string, *APIToken, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", nil, fmt.Errorf("create token: %w", err)
	}
	token := TokenPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	t := APIToken{OrgID: orgID, TokenHash: HashToken(token), Display: token[:displayLen]}
	if err := s.db.WithContext(ctx).Create(&t).Error; err != nil {
		return "", nil, fmt.Errorf("create token: %w", translate(err))
	}
	return token, &t, nil
}

// Authenticate finds the organisation of a token in clear. An unknown or
// revoked token is ErrNotFound.
func (s *TokenStore) Authenticate(ctx context.Context, token string) (*Principal, error) {
	if !strings.HasPrefix(token, TokenPrefix) {
		return nil, fmt.Errorf("authenticate: %w", ErrNotFound)
	}
	var p Principal
	actx, cancel := FirstAnswer(ctx, s.db)
	defer cancel()
	res := s.db.WithContext(actx).Raw(authenticateSQL, HashToken(token)).Scan(&p)
	if err := stalled(ctx, actx, res.Error); errors.Is(err, ErrStalled) {
		return nil, fmt.Errorf("authenticate: %w", err)
	}
	if res.Error != nil {
		return nil, fmt.Errorf("authenticate: %w", translate(res.Error))
	}
	if res.RowsAffected == 0 {
		return nil, fmt.Errorf("authenticate: %w", ErrNotFound)
	}
	return &p, nil
}

// authenticateSQL finds a token's organisation (sql/authenticate.sql).
var authenticateSQL = statement("authenticate")

// Revoke makes a token unusable (already cached copies expire with AUTH_CACHE_TTL).
func (s *TokenStore) Revoke(ctx context.Context, tokenID string) error {
	res := s.db.WithContext(ctx).Exec(`UPDATE api_tokens SET revoked_at = now() WHERE id = ? AND revoked_at IS NULL`, tokenID)
	if res.Error != nil {
		return fmt.Errorf("revoke token: %w", translate(res.Error))
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("revoke token: %w", ErrNotFound)
	}
	return nil
}

// displayLen is how many leading characters of a token are kept in clear
// (APIToken.Display), so a person can tell tokens apart.
const displayLen = 10

// TokenInfo is what an operator may see of a token: never the token itself.
type TokenInfo struct {
	ID      string
	OrgID   string
	OrgSlug string
	// Display is the token's first characters (vr_ and 7 more).
	Display   string
	CreatedAt time.Time
	// RevokedAt is nil while the token works.
	RevokedAt *time.Time
}

// The statements that read TokenInfo, each in sql/ under its name.
var (
	tokensOfOrgSQL     = statement("tokens_of_org")
	tokenByIDSQL       = statement("token_by_id")
	tokenByHashSQL     = statement("token_by_hash")
	tokensByDisplaySQL = statement("tokens_by_display")
)

// List returns the organisation's tokens, revoked ones included, oldest first.
func (s *TokenStore) List(ctx context.Context, orgID string) ([]TokenInfo, error) {
	var ts []TokenInfo
	if err := s.db.WithContext(ctx).Raw(tokensOfOrgSQL, orgID).Scan(&ts).Error; err != nil {
		return nil, fmt.Errorf("list tokens: %w", translate(err))
	}
	return ts, nil
}

// tokenRef is how an operator names a token.
type tokenRef int

const (
	refID      tokenRef = iota + 1 // the token's id
	refToken                       // the whole token, as a leaked one is found
	refDisplay                     // the start of its display prefix
)

func parseTokenRef(ref string) (tokenRef, error) {
	switch {
	case uuid.Validate(ref) == nil:
		return refID, nil
	case !strings.HasPrefix(ref, TokenPrefix) || len(ref) == len(TokenPrefix):
		return 0, fmt.Errorf("token %q: %w", ref, ErrInvalidTokenRef)
	case len(ref) > displayLen:
		return refToken, nil
	default:
		return refDisplay, nil
	}
}

// CheckTokenRef returns ErrInvalidTokenRef when ref cannot name a token:
// it must be a token id (a UUID), a whole token, or the start of a token's
// display prefix (vr_ and at least one more character).
func CheckTokenRef(ref string) error {
	_, err := parseTokenRef(ref)
	return err
}

// MaxTokenCandidates bounds the tokens an ambiguous reference reports.
const MaxTokenCandidates = 20

// AmbiguousTokenError: a display prefix matches several tokens.
type AmbiguousTokenError struct {
	Ref string
	// Candidates are the matching tokens, at most MaxTokenCandidates.
	Candidates []TokenInfo
	// More: there are more matches than Candidates.
	More bool
}

func (e *AmbiguousTokenError) Error() string {
	ids := make([]string, len(e.Candidates))
	for i, c := range e.Candidates {
		ids[i] = fmt.Sprintf("%s (%s of %s)", c.ID, c.Display, c.OrgSlug)
	}
	n := fmt.Sprint(len(e.Candidates))
	if e.More {
		n = "more than " + n
	}
	return fmt.Sprintf("%q matches %s tokens: name one by its id: %s", e.Ref, n, strings.Join(ids, ", "))
}

// Find returns the tokens ref names (see CheckTokenRef), revoked ones
// included, at most MaxTokenCandidates+1 of them.
func (s *TokenStore) Find(ctx context.Context, ref string) ([]TokenInfo, error) {
	kind, err := parseTokenRef(ref)
	if err != nil {
		return nil, err
	}
	var q string
	var arg any
	switch kind {
	case refID:
		q, arg = tokenByIDSQL, ref
	case refToken:
		q, arg = tokenByHashSQL, HashToken(ref)
	default:
		q, arg = tokensByDisplaySQL, ref
	}
	var ts []TokenInfo
	err = s.db.WithContext(ctx).Raw(q, arg, MaxTokenCandidates+1).Scan(&ts).Error
	if err != nil {
		return nil, fmt.Errorf("find token: %w", translate(err))
	}
	return ts, nil
}

// RevokeRef revokes the one token ref names (see CheckTokenRef) and returns
// it with its revocation time. No match is ErrNotFound, several an
// *AmbiguousTokenError, and a token revoked before is ErrAlreadyRevoked
// (with the token, whose RevokedAt is the earlier revocation).
func (s *TokenStore) RevokeRef(ctx context.Context, ref string) (TokenInfo, error) {
	ts, err := s.Find(ctx, ref)
	if err != nil {
		return TokenInfo{}, fmt.Errorf("revoke token: %w", err)
	}
	switch {
	case len(ts) == 0:
		return TokenInfo{}, fmt.Errorf("revoke token: no token matches %q: %w", ref, ErrNotFound)
	case len(ts) > 1:
		more := len(ts) > MaxTokenCandidates
		if more {
			ts = ts[:MaxTokenCandidates]
		}
		return TokenInfo{}, fmt.Errorf("revoke token: %w", &AmbiguousTokenError{Ref: ref, Candidates: ts, More: more})
	}
	t := ts[0]
	if t.RevokedAt != nil {
		return t, fmt.Errorf("revoke token %s: %w", t.ID, ErrAlreadyRevoked)
	}
	var revokedAt []time.Time
	err = s.db.WithContext(ctx).Raw(`UPDATE api_tokens SET revoked_at = now() WHERE id = ? AND revoked_at IS NULL RETURNING revoked_at`, t.ID).Scan(&revokedAt).Error
	if err != nil {
		return t, fmt.Errorf("revoke token: %w", translate(err))
	}
	if len(revokedAt) == 0 { // revoked (or deleted) since Find read it
		var again []TokenInfo
		if err := s.db.WithContext(ctx).Raw(tokenByIDSQL, t.ID, 1).Scan(&again).Error; err != nil {
			return t, fmt.Errorf("revoke token: %w", translate(err))
		}
		if len(again) == 0 {
			return t, fmt.Errorf("revoke token %s: %w", t.ID, ErrNotFound)
		}
		return again[0], fmt.Errorf("revoke token %s: %w", t.ID, ErrAlreadyRevoked)
	}
	t.RevokedAt = &revokedAt[0]
	return t, nil
}
