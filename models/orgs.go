package models

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"regexp"
	"strings"

	"gorm.io/gorm"
)

// TokenPrefix starts every API token, so a leaked one is recognisable (and
// secret scanners can find it).
const TokenPrefix = "vr_"

// OrgStore creates and finds organisations.
type OrgStore struct{ db *gorm.DB }

// NewOrgStore returns an OrgStore on db.
func NewOrgStore(db *gorm.DB) *OrgStore { return &OrgStore{db: db} }

var nonSlug = regexp.MustCompile(`[^a-z0-9]+`)

// Slugify turns a name into the slug an organisation is addressed by.
func Slugify(name string) string {
	s := strings.Trim(nonSlug.ReplaceAllString(strings.ToLower(name), "-"), "-")
	if len(s) > 50 {
		s = strings.TrimRight(s[:50], "-")
	}
	if s == "" {
		s = "org"
	}
	return s
}

// Create inserts an organisation named name, with a slug derived from it
// (suffixed -2, -3... when taken).
func (s *OrgStore) Create(ctx context.Context, name string) (*Organization, error) {
	name = strings.TrimSpace(name)
	if name == "" || len([]rune(name)) > 200 {
		return nil, fmt.Errorf("create organization: name must be 1 to 200 characters")
	}
	base := Slugify(name)
	for i := 1; i <= 100; i++ {
		slug := base
		if i > 1 {
			slug = fmt.Sprintf("%s-%d", base, i)
		}
		var org Organization
		res := s.db.WithContext(ctx).Raw(
			`INSERT INTO organizations (name, slug) VALUES (?, ?) ON CONFLICT (slug) DO NOTHING RETURNING *`,
			name, slug).Scan(&org)
		if res.Error != nil {
			return nil, fmt.Errorf("create organization: %w", translate(res.Error))
		}
		if res.RowsAffected == 1 {
			return &org, nil
		}
	}
	return nil, fmt.Errorf("create organization: no free slug for %q: %w", base, ErrConflict)
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
	res := s.db.WithContext(ctx).Exec(`UPDATE organizations SET monthly_run_quota = ? WHERE id = ?`, quota, orgID)
	if res.Error != nil {
		return fmt.Errorf("set quota: %w", translate(res.Error))
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("set quota: %w", ErrNotFound)
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
	t := APIToken{OrgID: orgID, TokenHash: HashToken(token), Display: token[:10]}
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
	res := s.db.WithContext(ctx).Raw(`
		SELECT o.id AS org_id, o.slug AS org_slug, t.id AS token_id, o.monthly_run_quota
		FROM api_tokens t JOIN organizations o ON o.id = t.org_id
		WHERE t.token_hash = ? AND t.revoked_at IS NULL`, HashToken(token)).Scan(&p)
	if res.Error != nil {
		return nil, fmt.Errorf("authenticate: %w", translate(res.Error))
	}
	if res.RowsAffected == 0 {
		return nil, fmt.Errorf("authenticate: %w", ErrNotFound)
	}
	return &p, nil
}

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
