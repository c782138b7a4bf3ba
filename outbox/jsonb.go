package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// numeric's limits: PostgreSQL stores a JSON number as numeric, which holds
// up to 131072 digits before the decimal point and 16383 after it.
const (
	maxNumericExp = 131071
	minNumericExp = -16383
)

// CheckJSONB reports why PostgreSQL's jsonb would refuse raw although Go's
// encoding/json accepts it: invalid UTF-8, a \u0000 escape, an unpaired UTF-16
// surrogate escape, or a number outside numeric's range. A payload that fails
// here must be parked, not sent: the statement carrying it would fail, and so
// would every replay of it.
func CheckJSONB(raw []byte) error {
	if len(raw) == 0 {
		return errors.New("empty")
	}
	if !utf8.Valid(raw) {
		return errors.New("not valid UTF-8")
	}
	if err := CheckEncodable(raw); err != nil {
		return err
	}
	if !json.Valid(raw) {
		return errors.New("not valid JSON")
	}
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c == '"':
			n, err := checkString(raw[i:])
			if err != nil {
				return err
			}
			i += n
		case c == '-' || c >= '0' && c <= '9':
			n, err := checkNumber(raw[i:])
			if err != nil {
				return err
			}
			i += n
		default:
			i++
		}
	}
	return nil
}

// checkString scans a JSON string starting at its opening quote (the input is
// valid JSON) and returns its length.
func checkString(s []byte) (int, error) {
	pendingHigh := false
	i := 1
	for i < len(s) {
		c := s[i]
		if c == '"' {
			if pendingHigh {
				return 0, errors.New(`has an unpaired UTF-16 surrogate escape, which PostgreSQL's jsonb refuses`)
			}
			return i + 1, nil
		}
		if c != '\\' {
			if pendingHigh {
				return 0, errors.New(`has an unpaired UTF-16 surrogate escape, which PostgreSQL's jsonb refuses`)
			}
			i++
			continue
		}
		if s[i+1] != 'u' {
			if pendingHigh {
				return 0, errors.New(`has an unpaired UTF-16 surrogate escape, which PostgreSQL's jsonb refuses`)
			}
			i += 2
			continue
		}
		var r rune
		fmt.Sscanf(string(s[i+2:i+6]), "%04x", &r)
		switch {
		case r == 0:
			return 0, errors.New(`contains \u0000, which PostgreSQL's jsonb cannot store`)
		case r >= 0xD800 && r <= 0xDBFF:
			if pendingHigh {
				return 0, errors.New(`has an unpaired UTF-16 surrogate escape, which PostgreSQL's jsonb refuses`)
			}
			pendingHigh = true
		case r >= 0xDC00 && r <= 0xDFFF:
			if !pendingHigh {
				return 0, errors.New(`has an unpaired UTF-16 surrogate escape, which PostgreSQL's jsonb refuses`)
			}
			pendingHigh = false
		default:
			if pendingHigh {
				return 0, errors.New(`has an unpaired UTF-16 surrogate escape, which PostgreSQL's jsonb refuses`)
			}
		}
		i += 6
	}
	return i, nil
}

// checkNumber scans a JSON number (valid JSON) and refuses one whose digits
// fall outside numeric's range.
func checkNumber(s []byte) (int, error) {
	i := 0
	if s[i] == '-' {
		i++
	}
	// Position of the most and least significant non-zero digits, as powers
	// of ten relative to the decimal point (before the exponent).
	hi, lo := 0, 0
	seen := false
	intStart := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	intDigits := s[intStart:i]
	for k, d := range intDigits {
		if d != '0' {
			p := len(intDigits) - 1 - k
			if !seen {
				hi, seen = p, true
			}
			lo = p
		}
	}
	if i < len(s) && s[i] == '.' {
		i++
		for k := 1; i < len(s) && s[i] >= '0' && s[i] <= '9'; k, i = k+1, i+1 {
			if s[i] != '0' {
				if !seen {
					hi, seen = -k, true
				}
				lo = -k
			}
		}
	}
	exp := 0
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		neg := false
		if s[i] == '+' || s[i] == '-' {
			neg = s[i] == '-'
			i++
		}
		for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			if exp < 10_000_000 {
				exp = exp*10 + int(s[i]-'0')
			}
		}
		if neg {
			exp = -exp
		}
	}
	if seen && (hi+exp > maxNumericExp || lo+exp < minNumericExp) {
		return 0, errors.New("has a number outside the range PostgreSQL's numeric (and so jsonb) can hold")
	}
	return i, nil
}

// MaxJSONDepth is how deep JSON may nest for the relay to re-encode it: Go's
// encoding/json refuses to encode or decode anything deeper, while
// PostgreSQL's json and jsonb accept much deeper values.
const MaxJSONDepth = 10000

// JSONDepth returns how deep the JSON text raw nests (0 for a scalar, 1 for
// [] or {}), counting brackets outside strings. It does not check that raw
// is JSON.
func JSONDepth(raw []byte) int {
	depth, deepest := 0, 0
	inString := false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			depth++
			deepest = max(deepest, depth)
		case ']', '}':
			depth--
		}
	}
	return deepest
}

// CheckEncodable reports why JSON that PostgreSQL holds (a json or jsonb
// value, or text that is JSON) cannot be re-encoded by the relay as it is:
// it is not valid UTF-8, or it nests deeper than MaxJSONDepth. Such a value
// is poison: it is a dead letter for the sagas and reaches the sinks as
// bytes (Event.RawPayload), never as JSON.
func CheckEncodable(raw []byte) error {
	if !utf8.Valid(raw) {
		return errors.New("is not valid UTF-8")
	}
	if d := JSONDepth(raw); d > MaxJSONDepth {
		return fmt.Errorf("nests %d levels deep, deeper than the %d levels the relay can encode", d, MaxJSONDepth)
	}
	return nil
}
