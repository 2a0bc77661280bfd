package main

// Turning captured requests into a pgbench script. Nothing here knows what
// valruns' statements mean: a value is classified by comparing captures.
//   - equal in every capture: a constant, written as captured;
//   - equal in two requests of one organisation but different between
//     organisations: a per-organisation constant, picked from an array by
//     the transaction's organisation (:org);
//   - different between two requests of one organisation: a per-request
//     value, made fresh in every transaction from pgbench random numbers
//     (UUIDs as md5(:rN)::uuid, integers as :rN, texts rebuilt around them),
//     the same fresh value wherever the captured value recurs.

import (
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

var uuidRe = regexp.MustCompile(`[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`)

var intRe = regexp.MustCompile(`^-?[0-9]{1,19}$`)

// scriptVar explains one pgbench variable or one value class.
type scriptVar struct {
	Name    string // :rN, or "" for a value written as captured
	Kind    string
	Example string // the captured value (shortened)
}

// pgbenchScript is a request turned into a pgbench script. Run it with
// -D norgs=N: each transaction picks its organisation in 1..N.
type pgbenchScript struct {
	Text       string
	Statements int
	RoundTrips int // of the captured request, prepares excluded
	Pipelines  int // round trips that carried several statements
	MaxOrgs    int // organisations the per-organisation arrays hold
	Vars       []scriptVar
	Notes      []string
}

// buildScript builds the script from two captures of one organisation (a,
// b) and one capture of each other organisation (others, in the order of
// the organisations 2..N; may be empty). typeName names parameter types.
func buildScript(a, b requestCapture, others []requestCapture, typeName map[uint32]string) (*pgbenchScript, error) {
	if err := sameShape(a, b); err != nil {
		return nil, fmt.Errorf("two captures of one organisation differ: %w", err)
	}
	sc := &pgbenchScript{Statements: len(a.Stmts), RoundTrips: a.RoundTrips - a.PrepareRoundTrips}
	if b.RoundTrips-b.PrepareRoundTrips < sc.RoundTrips {
		sc.RoundTrips = b.RoundTrips - b.PrepareRoundTrips
	}
	var orgs []requestCapture // organisation i+1 is orgs[i]
	orgs = append(orgs, a)
	for i, o := range others {
		if err := sameShape(a, o); err != nil {
			sc.Notes = append(sc.Notes, fmt.Sprintf("organisation %d's capture left out: %v", i+2, err))
			continue
		}
		orgs = append(orgs, o)
	}
	sc.MaxOrgs = len(orgs)

	g := &scriptGen{typeName: typeName, atoms: map[string]string{}, ints: map[string]string{}, orgUUID: map[string]string{}, fromResult: map[string]string{},
		paramFromResult: map[[2]int]string{}, listed: map[string]bool{}}
	// UUIDs seen in b: anything of a's not among them is per-request.
	inB := map[string]bool{}
	for _, s := range b.Stmts {
		for _, p := range s.Params {
			for _, u := range uuidRe.FindAllString(textOf(p), -1) {
				inB[strings.ToLower(u)] = true
			}
		}
	}
	g.inB = inB

	// Per-organisation constants, and the UUIDs that are one.
	type pos struct{ s, p int }
	perOrg := map[pos]bool{}
	for si, s := range a.Stmts {
		for pi, p := range s.Params {
			if !sameParam(p, b.Stmts[si].Params[pi]) {
				continue
			}
			for _, o := range orgs[1:] {
				if !sameParam(p, o.Stmts[si].Params[pi]) {
					perOrg[pos{si, pi}] = true
					break
				}
			}
			if perOrg[pos{si, pi}] && !p.Null && uuidRe.MatchString(p.Text) && len(p.Text) == 36 {
				key := strings.ToLower(p.Text)
				if _, ok := g.orgUUID[key]; !ok {
					g.orgUUID[key] = g.orgArray(orgColumn(orgs, si, pi), "uuid") + "::text"
				}
			}
		}
	}

	// Per-request UUIDs the database made (a run id from RETURNING) are
	// read back from the statement's result with \gset, where the request
	// reads them too; the others the server made itself, and so does the
	// script, afresh.
	gset := g.resultVars(a, b)

	var out strings.Builder
	var body strings.Builder
	prev := [2]int{-1, -1}
	inPipe := false
	groups := groupsOf(a.Stmts)
	left := 0 // statements of the current round trip still to write
	for si, s := range a.Stmts {
		exprs := make([]string, len(s.Params))
		for pi, p := range s.Params {
			q := b.Stmts[si].Params[pi]
			switch {
			case p.Undecoded:
				return nil, fmt.Errorf("statement %d parameter $%d: binary value of type oid %d cannot be written as text", si+1, pi+1, p.OID)
			case sameParam(p, q) && !perOrg[pos{si, pi}]:
				exprs[pi] = g.literal(p)
			case sameParam(p, q):
				exprs[pi] = g.orgArray(orgColumn(orgs, si, pi), g.typ(p.OID))
				g.note("per-organisation constant", p.Text)
			case g.paramFromResult[[2]int{si, pi}] != "":
				exprs[pi] = g.cast(":"+g.paramFromResult[[2]int{si, pi}], p.OID)
			default:
				exprs[pi] = g.perRequest(p, q)
			}
		}
		sql, err := substitute(s.SQL, exprs)
		if err != nil {
			return nil, fmt.Errorf("statement %d: %w", si+1, err)
		}
		// Statements the server ran in one implicit transaction (no Sync
		// between them) share a pipeline, whatever bursts the client sent
		// them in: a statement can rely on what an earlier one set or
		// locked for the transaction (the start's locks and settings).
		cur := [2]int{s.Conn, s.Txn}
		if cur != prev {
			if inPipe {
				body.WriteString("\\endpipeline\n")
				inPipe = false
			}
			left = groups[cur]
			prev = cur
		}
		// \gset cannot be used in a pipeline: such a statement goes alone.
		if gset[si] != "" && inPipe {
			body.WriteString("\\endpipeline\n")
			inPipe = false
			sc.Notes = append(sc.Notes, fmt.Sprintf("statement %d was pipelined by the server but runs alone here: pgbench cannot read a result (\\gset) inside a pipeline", si+1))
		}
		if !inPipe && gset[si] == "" && left > 1 && !nextIsGset(gset, si) {
			body.WriteString("\\startpipeline\n")
			inPipe = true
			sc.Pipelines++
		}
		left--
		sql = strings.TrimRight(strings.TrimSpace(sql), ";")
		if gset[si] != "" {
			body.WriteString(sql + " \\gset " + gset[si] + "\n")
		} else {
			body.WriteString(sql + ";\n")
		}
	}
	if inPipe {
		body.WriteString("\\endpipeline\n")
	}

	fmt.Fprintf(&out, "-- valruns new-key start, captured from the running server (%d statements, %d round trips)\n", sc.Statements, sc.RoundTrips)
	out.WriteString("\\set org random(1, :norgs)\n")
	for _, v := range g.vars {
		if l := g.setLine[strings.TrimPrefix(v.Name, ":")]; l != "" {
			out.WriteString(l + "\n")
		}
	}
	out.WriteString(body.String())
	sc.Text = out.String()
	sc.Vars = g.vars
	if err := checkColons(sc.Text); err != nil {
		return nil, err
	}
	return sc, nil
}

// nextIsGset: the next statement reads its result, so a pipeline opened
// now would hold one statement.
func nextIsGset(gset map[int]string, si int) bool { return gset[si+1] != "" }

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// resultVars finds the per-request UUIDs that first appear in the result
// of a statement (one row in both captures) before any statement sends
// them: they are read back with \gset sN_ and used as :sN_column. It
// returns the \gset prefix of each statement that needs one.
func (g *scriptGen) resultVars(a, b requestCapture) map[int]string {
	gset := map[int]string{}
	seen := map[string]bool{}
	for si, s := range a.Stmts {
		for _, p := range s.Params {
			for _, u := range uuidRe.FindAllString(textOf(p), -1) {
				seen[strings.ToLower(u)] = true
			}
		}
		if s.RowCount != 1 || b.Stmts[si].RowCount != 1 || len(s.Rows) == 0 || len(s.Columns) != len(s.Rows[0]) {
			continue
		}
		valid := true
		for _, c := range s.Columns {
			valid = valid && identRe.MatchString(c)
		}
		for ci, v := range s.Rows[0] {
			u := strings.ToLower(v.Text)
			if v.Null || len(u) != 36 || !uuidRe.MatchString(u) || seen[u] || g.inB[u] || !g.usedLater(a, si, u) {
				continue
			}
			if !valid {
				g.note("made by the database but its result columns cannot be read with \\gset: a fresh UUID instead", u)
				continue
			}
			prefix := fmt.Sprintf("s%d_", si+1)
			gset[si] = prefix
			g.fromResult[u] = prefix + s.Columns[ci]
			g.listed[prefix+s.Columns[ci]] = true
			g.vars = append(g.vars, scriptVar{Name: ":" + prefix + s.Columns[ci],
				Kind:    fmt.Sprintf("per-request UUID made by the database: column %s of statement %d's result (\\gset)", s.Columns[ci], si+1),
				Example: u})
			seen[u] = true
		}
	}
	// Any other per-request value a statement sends that an earlier
	// single-row result held, in both captures (an integer the database
	// counted or claimed, say), is read back the same way.
	for si, s := range a.Stmts {
		for pi, p := range s.Params {
			q := b.Stmts[si].Params[pi]
			if p.Null || q.Null || sameParam(p, q) || g.fromResult[strings.ToLower(p.Text)] != "" {
				continue
			}
			for j := si - 1; j >= 0; j-- {
				col := sameColumn(a.Stmts[j], b.Stmts[j], p.Text, q.Text)
				if col == "" || sentBy(a.Stmts[:j+1], p.Text) {
					continue // not in that result, or the client made it (and sent it first)
				}
				prefix := fmt.Sprintf("s%d_", j+1)
				if gset[j] == "" {
					gset[j] = prefix
				}
				name := prefix + col
				if !g.listed[name] {
					g.listed[name] = true
					g.vars = append(g.vars, scriptVar{Name: ":" + name,
						Kind:    fmt.Sprintf("per-request value made by the database: column %s of statement %d's result (\\gset)", col, j+1),
						Example: p.Text})
				}
				g.paramFromResult[[2]int{si, pi}] = name
				break
			}
		}
	}
	return gset
}

// sentBy reports whether one of stmts sends v: as a parameter, or for a
// UUID also inside one.
func sentBy(stmts []wireStmt, v string) bool {
	isUUID := len(v) == 36 && uuidRe.MatchString(v)
	v = strings.ToLower(v)
	for _, s := range stmts {
		for _, p := range s.Params {
			switch {
			case p.Null:
			case p.Text == v:
				return true
			case isUUID && strings.Contains(strings.ToLower(textOf(p)), v):
				return true
			}
		}
	}
	return false
}

// sameColumn is the column of a's and b's single-row results that holds
// va in a and vb in b ("" when none does, or when pgbench could not
// \gset that result).
func sameColumn(a, b wireStmt, va, vb string) string {
	if a.RowCount != 1 || b.RowCount != 1 || len(a.Rows) == 0 || len(b.Rows) == 0 ||
		len(a.Columns) != len(a.Rows[0]) || len(b.Rows[0]) != len(a.Rows[0]) {
		return ""
	}
	for _, c := range a.Columns {
		if !identRe.MatchString(c) {
			return ""
		}
	}
	for ci := range a.Rows[0] {
		x, y := a.Rows[0][ci], b.Rows[0][ci]
		if !x.Null && !y.Null && x.Text == va && y.Text == vb {
			return a.Columns[ci]
		}
	}
	return ""
}

// usedLater reports whether a statement after si sends u.
func (g *scriptGen) usedLater(a requestCapture, si int, u string) bool {
	for _, s := range a.Stmts[si+1:] {
		for _, p := range s.Params {
			if strings.Contains(strings.ToLower(textOf(p)), u) {
				return true
			}
		}
	}
	return false
}

// groupsOf counts the statements of each implicit transaction (Conn, Txn).
func groupsOf(stmts []wireStmt) map[[2]int]int {
	m := map[[2]int]int{}
	for _, s := range stmts {
		m[[2]int{s.Conn, s.Txn}]++
	}
	return m
}

func sameShape(a, b requestCapture) error {
	if len(a.Stmts) != len(b.Stmts) {
		return fmt.Errorf("%d statements vs %d", len(a.Stmts), len(b.Stmts))
	}
	for i := range a.Stmts {
		if a.Stmts[i].SQL != b.Stmts[i].SQL {
			return fmt.Errorf("statement %d differs: %q vs %q", i+1, short(a.Stmts[i].SQL, 80), short(b.Stmts[i].SQL, 80))
		}
		if len(a.Stmts[i].Params) != len(b.Stmts[i].Params) {
			return fmt.Errorf("statement %d: %d parameters vs %d", i+1, len(a.Stmts[i].Params), len(b.Stmts[i].Params))
		}
	}
	return nil
}

func sameParam(a, b wireParam) bool { return a.Null == b.Null && a.Text == b.Text }

// textOf is a parameter's text, with bytea decoded when it is UTF-8 text.
func textOf(p wireParam) string {
	if s, ok := byteaText(p); ok {
		return s
	}
	return p.Text
}

func byteaText(p wireParam) (string, bool) {
	if p.OID != 17 || !strings.HasPrefix(p.Text, `\x`) {
		return "", false
	}
	raw, err := hex.DecodeString(p.Text[2:])
	if err != nil || !utf8.Valid(raw) {
		return "", false
	}
	return string(raw), true
}

type scriptGen struct {
	typeName map[uint32]string
	inB      map[string]bool
	atoms    map[string]string // per-request UUID (lowercase) -> variable
	ints     map[string]string // per-request integer -> variable
	orgUUID  map[string]string // per-organisation UUID -> expression
	// per-request UUID made by the database -> the pgbench variable \gset fills
	fromResult map[string]string
	// statement and parameter -> the \gset variable that holds its value
	paramFromResult map[[2]int]string
	listed          map[string]bool
	vars            []scriptVar
	setLine         map[string]string
	n               int
	noted           map[string]bool
}

func (g *scriptGen) typ(oid uint32) string {
	if t := g.typeName[oid]; t != "" {
		return t
	}
	return ""
}

func (g *scriptGen) newVar(kind, example, set string) string {
	g.n++
	name := fmt.Sprintf("r%d", g.n)
	if g.setLine == nil {
		g.setLine = map[string]string{}
	}
	g.setLine[name] = fmt.Sprintf(`\set %s %s`, name, set)
	g.vars = append(g.vars, scriptVar{Name: ":" + name, Kind: kind, Example: short(example, 60)})
	return name
}

func (g *scriptGen) note(kind, example string) {
	if g.noted == nil {
		g.noted = map[string]bool{}
	}
	k := kind + "\x00" + example
	if g.noted[k] {
		return
	}
	g.noted[k] = true
	g.vars = append(g.vars, scriptVar{Kind: kind, Example: short(example, 60)})
}

// cast wraps an expression in a cast to the parameter's type.
func (g *scriptGen) cast(expr string, oid uint32) string {
	if t := g.typ(oid); t != "" {
		return "CAST(" + expr + " AS " + t + ")"
	}
	return expr
}

// literal writes a constant parameter as a typed SQL literal.
func (g *scriptGen) literal(p wireParam) string {
	if p.Null {
		return g.cast("NULL", p.OID)
	}
	return g.cast(quote(p.Text), p.OID)
}

// orgColumn is parameter pi of statement si in each organisation's capture.
func orgColumn(orgs []requestCapture, si, pi int) []wireParam {
	vals := make([]wireParam, len(orgs))
	for i, o := range orgs {
		vals[i] = o.Stmts[si].Params[pi]
	}
	return vals
}

// orgArray is the per-organisation value of the transaction's :org.
func (g *scriptGen) orgArray(vals []wireParam, typ string) string {
	q := make([]string, len(vals))
	for i, v := range vals {
		if v.Null {
			q[i] = "NULL"
		} else {
			q[i] = quote(v.Text)
		}
	}
	arr := "ARRAY[" + strings.Join(q, ",") + "]"
	if strings.HasSuffix(typ, "[]") {
		// An array parameter (a statement over arrays): index the array
		// literals' texts, then cast the one chosen (an array of arrays
		// would be two-dimensional, and [:org] of it NULL).
		return "CAST((" + arr + ")[:org] AS " + typ + ")"
	}
	if typ != "" {
		arr = "CAST(" + arr + " AS " + typ + "[])"
	}
	return "(" + arr + ")[:org]"
}

// uuidVar is the fresh UUID standing for a per-request UUID of the capture.
func (g *scriptGen) uuidVar(u string) string {
	u = strings.ToLower(u)
	if v := g.fromResult[u]; v != "" {
		return "CAST(:" + v + " AS uuid)"
	}
	name, ok := g.atoms[u]
	if !ok {
		name = g.newVar("per-request UUID: md5(:rN)::uuid", u, "random(1, 9223372036854775806)")
		g.atoms[u] = name
	}
	return "CAST(md5(:" + name + "::text) AS uuid)"
}

// perRequest writes a value that differs between two requests of one
// organisation (a's value; b's tells its range).
func (g *scriptGen) perRequest(a, b wireParam) string {
	if a.Null || b.Null {
		g.note("differs between requests (NULL in one), written as captured", a.Text)
		return g.literal(a)
	}
	if ai, bi := strings.Trim(a.Text, "{}"), strings.Trim(b.Text, "{}"); strings.HasSuffix(g.typ(a.OID), "[]") &&
		intRe.MatchString(ai) && intRe.MatchString(bi) {
		// A one-element array of a per-request integer (an advisory lock
		// number in the start's statement over arrays).
		name, ok := g.ints[ai]
		if !ok {
			name = g.newVar("per-request integer", ai, "random("+intRange(ai, bi)+")")
			g.ints[ai] = name
		}
		return g.cast("ARRAY[:"+name+"]", a.OID)
	}
	if intRe.MatchString(a.Text) && intRe.MatchString(b.Text) {
		name, ok := g.ints[a.Text]
		if !ok {
			name = g.newVar("per-request integer", a.Text, "random("+intRange(a.Text, b.Text)+")")
			g.ints[a.Text] = name
		}
		return g.cast(":"+name, a.OID)
	}
	if s, ok := byteaText(a); ok {
		if e, changed := g.rebuild(s); changed {
			return "convert_to(" + e + ", 'UTF8')"
		}
	}
	if e, changed := g.rebuild(a.Text); changed {
		if len(a.Text) == 36 && uuidRe.MatchString(a.Text) && !strings.HasSuffix(g.typ(a.OID), "[]") {
			return g.cast(g.uuidVar(a.Text), a.OID)
		}
		return g.cast(e, a.OID)
	}
	// A per-request value with no UUID in it: a digest, or a timestamp.
	switch {
	case a.OID == 17 && len(a.Text) == 2+64:
		name := g.newVar("per-request 32-byte value: sha256(:rN)", a.Text, "random(1, 9223372036854775806)")
		return "sha256(CAST(:" + name + " AS text)::bytea)"
	case isHex(a.Text) && len(a.Text) == 32:
		name := g.newVar("per-request hex value: md5(:rN)", a.Text, "random(1, 9223372036854775806)")
		return g.cast("md5(:"+name+"::text)", a.OID)
	case isHex(a.Text) && len(a.Text) == 64:
		name := g.newVar("per-request hex value: sha256(:rN)", a.Text, "random(1, 9223372036854775806)")
		return g.cast("encode(sha256(CAST(:"+name+" AS text)::bytea), 'hex')", a.OID)
	}
	g.note("differs between requests, written as captured", a.Text)
	return g.literal(a)
}

// rebuild writes s as an SQL text expression in which every per-request
// UUID is a fresh one and every per-organisation UUID the transaction's
// organisation's; changed is false when s has neither.
func (g *scriptGen) rebuild(s string) (string, bool) {
	locs := uuidRe.FindAllStringIndex(s, -1)
	var parts []string
	changed := false
	last := 0
	for _, l := range locs {
		u := strings.ToLower(s[l[0]:l[1]])
		var e string
		switch {
		case !g.inB[u]:
			e = g.uuidVar(u) + "::text"
		case g.orgUUID[u] != "":
			e = g.orgUUID[u]
		default:
			continue
		}
		if l[0] > last {
			parts = append(parts, quote(s[last:l[0]]))
		}
		parts = append(parts, e)
		last = l[1]
		changed = true
	}
	if !changed {
		return "", false
	}
	if last < len(s) {
		parts = append(parts, quote(s[last:]))
	}
	return "(" + strings.Join(parts, " || ") + ")", true
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil && s != ""
}

// intRange is a random() range that holds both observed values and stays
// in the range their column or cast accepts (a 32-bit half of a lock id
// cast to oid must stay one). pgbench refuses a range wider than int64.
func intRange(a, b string) string {
	x, _ := strconv.ParseInt(a, 10, 64)
	y, _ := strconv.ParseInt(b, 10, 64)
	neg := x < 0 || y < 0
	m := max(abs(x), abs(y))
	for _, bound := range []int64{1<<15 - 1, 1<<31 - 1, 1<<32 - 1, 1<<62 - 1} {
		if neg && bound == 1<<32-1 {
			continue
		}
		if m <= bound {
			if neg {
				return fmt.Sprintf("%d, %d", -bound, bound)
			}
			return fmt.Sprintf("0, %d", bound)
		}
	}
	if neg {
		return fmt.Sprintf("%d, %d", -(1<<62 - 1), 1<<62-1)
	}
	return "1, 9223372036854775806"
}

func abs(x int64) int64 {
	if x < 0 {
		if x == -1<<63 {
			return 1<<63 - 1
		}
		return -x
	}
	return x
}

// quote writes s as an E” string literal. Colons become \072: pgbench
// reads ":name" anywhere in a command as a variable, string literals too.
func quote(s string) string {
	var b strings.Builder
	b.WriteString("E'")
	for _, r := range s {
		switch r {
		case '\\':
			b.WriteString(`\\`)
		case '\'':
			b.WriteString(`\'`)
		case ':':
			b.WriteString(`\072`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(&b, `\x%02x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteString("'")
	return b.String()
}

// substitute replaces the placeholders $1..$n of sql (outside literals,
// identifiers and comments) with exprs, and rewrites string literals that
// hold a colon as E” literals (see quote).
func substitute(sql string, exprs []string) (string, error) {
	var out strings.Builder
	i := 0
	for i < len(sql) {
		c := sql[i]
		switch {
		case c == '\'' || ((c == 'E' || c == 'e') && i+1 < len(sql) && sql[i+1] == '\'' && !identChar(prevByte(sql, i))):
			escaped := c != '\''
			start := i
			if escaped {
				i++
			}
			val, end, err := readString(sql, i, escaped)
			if err != nil {
				return "", err
			}
			if strings.ContainsRune(val, ':') {
				out.WriteString(quote(val))
			} else {
				out.WriteString(sql[start:end])
			}
			i = end
		case c == '"':
			j := strings.IndexByte(sql[i+1:], '"')
			if j < 0 {
				return "", fmt.Errorf("unterminated identifier")
			}
			out.WriteString(sql[i : i+j+2])
			i += j + 2
		case c == '-' && strings.HasPrefix(sql[i:], "--"):
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				j = len(sql) - i
			}
			// pgbench would read a colon in a comment too
			out.WriteString(strings.ReplaceAll(sql[i:i+j], ":", " "))
			i += j
		case c == '/' && strings.HasPrefix(sql[i:], "/*"):
			j := strings.Index(sql[i:], "*/")
			if j < 0 {
				return "", fmt.Errorf("unterminated comment")
			}
			out.WriteString(strings.ReplaceAll(sql[i:i+j+2], ":", " "))
			i += j + 2
		case c == '$' && i+1 < len(sql) && sql[i+1] >= '0' && sql[i+1] <= '9' && !identChar(prevByte(sql, i)):
			j := i + 1
			for j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
				j++
			}
			n, _ := strconv.Atoi(sql[i+1 : j])
			if n < 1 || n > len(exprs) {
				return "", fmt.Errorf("placeholder $%d without a parameter", n)
			}
			out.WriteString(exprs[n-1])
			i = j
		case c == '$':
			// a dollar-quoted string: $tag$ ... $tag$
			j := i + 1
			for j < len(sql) && identChar(sql[j]) {
				j++
			}
			if j < len(sql) && sql[j] == '$' && !identChar(prevByte(sql, i)) {
				tag := sql[i : j+1]
				k := strings.Index(sql[j+1:], tag)
				if k < 0 {
					return "", fmt.Errorf("unterminated dollar quote")
				}
				body := sql[j+1 : j+1+k]
				if strings.ContainsRune(body, ':') {
					out.WriteString(quote(body))
				} else {
					out.WriteString(sql[i : j+1+k+len(tag)])
				}
				i = j + 1 + k + len(tag)
			} else {
				out.WriteByte(c)
				i++
			}
		default:
			out.WriteByte(c)
			i++
		}
	}
	return out.String(), nil
}

func prevByte(s string, i int) byte {
	if i == 0 {
		return ' '
	}
	return s[i-1]
}

func identChar(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// readString reads the literal opening at sql[i] ('), returning its value
// and the index after it. escaped: an E” literal (backslash escapes).
func readString(sql string, i int, escaped bool) (string, int, error) {
	var v strings.Builder
	j := i + 1
	for j < len(sql) {
		c := sql[j]
		switch {
		case escaped && c == '\\' && j+1 < len(sql):
			// keep the escape as PostgreSQL reads it: enough for our purpose
			// (re-quoting) for the common escapes
			n := sql[j+1]
			switch n {
			case 'n':
				v.WriteByte('\n')
			case 't':
				v.WriteByte('\t')
			case 'r':
				v.WriteByte('\r')
			default:
				if n >= '0' && n <= '7' {
					k := j + 1
					val := 0
					for k < len(sql) && k < j+4 && sql[k] >= '0' && sql[k] <= '7' {
						val = val*8 + int(sql[k]-'0')
						k++
					}
					v.WriteByte(byte(val))
					j = k
					continue
				}
				v.WriteByte(n)
			}
			j += 2
		case c == '\'' && j+1 < len(sql) && sql[j+1] == '\'':
			v.WriteByte('\'')
			j += 2
		case c == '\'':
			return v.String(), j + 1, nil
		default:
			v.WriteByte(c)
			j++
		}
	}
	return "", 0, fmt.Errorf("unterminated string literal")
}

var colonVarRe = regexp.MustCompile(`(^|[^:]):([A-Za-z_][A-Za-z0-9_]*)`)

// checkColons fails when a command would make pgbench read a variable the
// script does not set.
func checkColons(script string) error {
	set := map[string]bool{"norgs": true}
	var prefixes []string
	for _, line := range strings.Split(script, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == `\set` {
			set[f[1]] = true
		}
		if _, after, ok := strings.Cut(line, `\gset `); ok {
			prefixes = append(prefixes, strings.TrimSpace(after))
		}
	}
	for _, line := range strings.Split(script, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		for _, m := range colonVarRe.FindAllStringSubmatch(line, -1) {
			if !set[m[2]] && !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(m[2], p) }) {
				return fmt.Errorf("the script would read an unset pgbench variable :%s in %q", m[2], short(line, 120))
			}
		}
	}
	return nil
}
