package dbconn

import (
	"errors"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

// A connection string that does not parse is never echoed, not even
// "redacted": the driver's redaction is best effort, and a keyword DSN with
// spaces around "=" ("password = S3cr3tPw", which is valid) came out whole,
// password included. The message says which part failed instead.

// parseErrorMessage describes why dsn did not parse without quoting it.
func parseErrorMessage(err error, dsn string) string {
	const prefix = "--database-url is not a valid PostgreSQL URL or keyword/value DSN: "
	const suffix = " (the value is not shown: it may hold a password)"
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return prefix + "it cannot be parsed" + suffix
	}
	what := driverMessage(pce)
	if what == "" {
		what = "it cannot be parsed"
	}
	if d := safeDetail(pce.Unwrap()); d != "" {
		what += " (" + d + ")"
	}
	// A last guard: whatever came through must not hold the password as
	// far as it can be told from a string that does not parse.
	return prefix + RedactAll(what, Passwords(dsn)) + suffix
}

// driverMessage is the part of a ParseConfigError that names the problem
// ("invalid port", "failed to parse as keyword/value"), without the
// connection string that Error puts in front of it. The driver's messages
// never contain "`: ", so the last one ends the quoted string.
func driverMessage(e *pgconn.ParseConfigError) string {
	full := e.Error()
	if inner := e.Unwrap(); inner != nil {
		full = strings.TrimSuffix(full, " ("+inner.Error()+")")
	}
	i := strings.LastIndex(full, "`: ")
	if i < 0 {
		return ""
	}
	return full[i+3:]
}

// safeDetail keeps the part of the driver's underlying error that says
// what is wrong, never a value: url.Parse's error quotes the whole URL and
// strconv's the number it could not read.
func safeDetail(err error) string {
	if err == nil {
		return ""
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne *strconv.NumError
	if errors.As(err, &ne) {
		return "not a number: " + ne.Err.Error()
	}
	msg := err.Error()
	// Messages that quote a value ("invalid port \":abc\" after host")
	// keep only the words before the quote.
	if i := strings.IndexAny(msg, "\"'`"); i >= 0 {
		msg = strings.TrimSpace(msg[:i])
	}
	return msg
}

var (
	// keywordPassword finds password=value in a keyword/value DSN, spaces
	// around "=" allowed, the value quoted or not.
	keywordPassword = regexp.MustCompile(`(?i)(?:^|\s)(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)
	// queryPassword finds password= in a URL's query.
	queryPassword = regexp.MustCompile(`(?i)[?&](?:ssl)?password=([^&#]*)`)
)

// Passwords returns the passwords a connection string holds, as far as
// they can be found: from the parsed form when it parses, else by reading
// the text as a URL's user information and query and as keyword/value
// pairs. It is what logs and errors are scrubbed of.
func Passwords(dsn string) []string {
	var out []string
	add := func(p string) {
		if p != "" && !contains(out, p) {
			out = append(out, p)
		}
	}
	add(PasswordOf(dsn))
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		rest := dsn[strings.Index(dsn, "://")+3:]
		// The user information ends at the last "@" before the path.
		authority := rest
		if i := strings.IndexAny(rest, "/?#"); i >= 0 {
			authority = rest[:i]
		}
		if at := strings.LastIndex(authority, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(authority[:at], ":"); ok {
				add(pw)
				if u, err := url.PathUnescape(pw); err == nil {
					add(u)
				}
			}
		}
		for _, m := range queryPassword.FindAllStringSubmatch(dsn, -1) {
			add(m[1])
			if u, err := url.QueryUnescape(m[1]); err == nil {
				add(u)
			}
		}
		return out
	}
	for _, m := range keywordPassword.FindAllStringSubmatch(dsn, -1) {
		v := m[1]
		if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
			add(v)
			v = strings.ReplaceAll(strings.ReplaceAll(v[1:len(v)-1], `\'`, `'`), `\\`, `\`)
		}
		add(v)
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// replaceWhole replaces the occurrences of secret in s that stand as a
// whole word: a letter or digit at the secret's edge must not continue in
// s. Masking every "a" of every message because a password or token is "a"
// used to give it away ("relxxxxxy stxxxxxrted").
func replaceWhole(s, secret, mask string) string {
	if secret == "" || !strings.Contains(s, secret) {
		return s
	}
	first, _ := utf8.DecodeRuneInString(secret)
	last, _ := utf8.DecodeLastRuneInString(secret)
	word := func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }
	var b strings.Builder
	done := 0 // s[:done] is written
	for from := 0; from < len(s); {
		i := strings.Index(s[from:], secret)
		if i < 0 {
			break
		}
		i += from
		end := i + len(secret)
		before, _ := utf8.DecodeLastRuneInString(s[:i])
		after, _ := utf8.DecodeRuneInString(s[end:])
		if (i == 0 || !word(first) || !word(before)) && (end == len(s) || !word(last) || !word(after)) {
			b.WriteString(s[done:i])
			b.WriteString(mask)
			done, from = end, end
			continue
		}
		// Step one rune, so that an overlapping whole occurrence is found.
		_, size := utf8.DecodeRuneInString(s[i:])
		from = i + size
	}
	b.WriteString(s[done:])
	return b.String()
}
