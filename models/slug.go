package models

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// nonSlug is a run of characters a slug spells as one -.
var nonSlug = regexp.MustCompile(`[^a-z0-9]+`)

// latin spells the Latin letters that have no decomposition into an ASCII
// letter and marks (NFD leaves them whole) the way they are usually written
// in ASCII (lowercase: a slug is).
var latin = map[rune]string{
	'ß': "ss", 'ẞ': "ss", 'æ': "ae", 'Æ': "ae", 'œ': "oe", 'Œ': "oe", 'ø': "o", 'Ø': "o",
	'ł': "l", 'Ł': "l", 'đ': "d", 'Đ': "d", 'ð': "d", 'Ð': "d", 'þ': "th", 'Þ': "th",
	'ı': "i", 'ħ': "h", 'Ħ': "h", 'ŋ': "ng", 'Ŋ': "ng",
}

// UnsluggableError: no readable slug can be derived from an organisation's
// name, because it has letters without an ASCII spelling (Letters) or no
// letters or digits at all. The caller chooses the slug instead.
type UnsluggableError struct {
	Name string
	// Letters are the name's letters and digits that have no ASCII
	// spelling; empty when the name has no letters or digits at all.
	Letters string
}

func (e *UnsluggableError) Error() string {
	if e.Letters == "" {
		return fmt.Sprintf("name %q has no letters or digits to derive a slug from", e.Name)
	}
	return fmt.Sprintf("name %q: %s has no ASCII spelling to derive a readable slug from", e.Name, e.Letters)
}

// Slugify derives the slug an organisation is addressed by from its name:
// letters lose their accents (Ünïcödé: unicode; ß: ss; compatibility forms
// such as ﬁ or full-width Ａ are spelled out by NFKD), runs of anything
// but a-z and 0-9 become one -, and at most 50 characters are kept. A name
// whose letters cannot all be spelled in ASCII (東京, Київ) is an
// *UnsluggableError rather than a slug that drops them.
func Slugify(name string) (string, error) {
	var b strings.Builder
	var foreign []rune
	for _, c := range name {
		spelled := true
		// Each character on its own, so that a refusal names it as written (ї, not і).
		for _, r := range norm.NFKD.String(string(c)) {
			switch {
			case unicode.Is(unicode.Mn, r): // a combining mark: the accent of the letter before it
			case r < unicode.MaxASCII:
				b.WriteRune(unicode.ToLower(r))
			case latin[r] != "":
				b.WriteString(latin[r])
			case unicode.IsLetter(r) || unicode.IsDigit(r):
				spelled = false
			default:
				b.WriteByte(' ') // punctuation, symbols and spaces separate words
			}
		}
		if !spelled {
			foreign = append(foreign, c)
		}
	}
	if len(foreign) > 0 {
		return "", &UnsluggableError{Name: name, Letters: string(foreign)}
	}
	s := strings.Trim(nonSlug.ReplaceAllString(b.String(), "-"), "-")
	if len(s) > 50 {
		s = strings.TrimRight(s[:50], "-")
	}
	if s == "" {
		return "", &UnsluggableError{Name: name}
	}
	return s, nil
}
