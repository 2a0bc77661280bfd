package models_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/models"
)

// TestSlugify: a name's letters are spelled in ASCII (accents dropped,
// ligatures and compatibility forms spelled out), never silently dropped: a
// name with letters that have no ASCII spelling is refused, naming them.
func TestSlugify(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ name, want, unspelled string }{
		{name: "Acme Inc", want: "acme-inc"},
		{name: "Ünïcödé Shop", want: "unicode-shop"}, // was n-c-d-shop
		{name: "Crème Brûlée & Co.", want: "creme-brulee-co"},
		{name: "Straße", want: "strasse"},
		{name: "Øresund Æbler Łódź", want: "oresund-aebler-lodz"},
		{name: "ﬁnance Ｎｏｒｄ ２", want: "finance-nord-2"},
		{name: "  -- Zoë's café --  ", want: "zoe-s-cafe"},
		{name: strings.Repeat("é", 60), want: strings.Repeat("e", 50)},
		{name: "東京 Shop", unspelled: "東京"},
		{name: "Київ", unspelled: "Київ"},
		{name: "★ ☆ !!", unspelled: ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := models.Slugify(tt.name)
			if tt.want != "" {
				require.NoError(t, err)
				require.Equal(t, tt.want, got)
				require.NoError(t, models.CheckSlug(got))
				return
			}
			var ue *models.UnsluggableError
			require.True(t, errors.As(err, &ue), "%q: want an UnsluggableError, got %q, %v", tt.name, got, err)
			require.Equal(t, tt.unspelled, ue.Letters)
		})
	}
}
