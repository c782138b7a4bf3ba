package httpapi

import (
	"fmt"
	"math"
	"strings"
	"unicode"
)

// MinTokenBits is the least entropy a token must carry: 32 hex characters
// or 22 base64 characters. Below that, guessing is a matter of time, and a
// short token also turns log redaction into a hint (masking every "a" in
// every message gives the token "a" away).
const MinTokenBits = 128

// MakeTokenHint is how the error tells the operator to make a good token.
const MakeTokenHint = "make one with: openssl rand -hex 32"

// CheckTokenStrength refuses a token that cannot carry MinTokenBits bits:
// its length times the bits per character of the smallest alphabet it fits
// (hex 4, base64 6, printable ASCII 6.5), or one that repeats a few
// characters (a random token of that length uses many). what names the
// token in the message, e.g. "--api-token" or "tokens.yaml:3:10: token".
// Every place that accepts a token (the flag, a token file) calls it.
func CheckTokenStrength(what, token string) error {
	if token == "" {
		return fmt.Errorf("%s is empty; %s", what, MakeTokenHint)
	}
	// A token travels as one word in "Authorization: Bearer <token>"; a
	// phrase of words also carries far fewer bits than its length says.
	if strings.ContainsFunc(token, unicode.IsSpace) {
		return fmt.Errorf("%s holds spaces; %s", what, MakeTokenHint)
	}
	if hasControl(token) {
		return fmt.Errorf("%s holds control characters; %s", what, MakeTokenHint)
	}
	bits := float64(len(token)) * bitsPerChar(token)
	distinct := map[rune]bool{}
	for _, r := range token {
		distinct[r] = true
	}
	// A token of 32 hex characters drawn at random uses 8 or fewer distinct
	// characters with a probability below 1e-9.
	if bits < MinTokenBits || len(distinct) < 9 {
		return fmt.Errorf("%s is too weak: it must carry at least %d random bits (32 hex or 22 base64 characters); %s", what, MinTokenBits, MakeTokenHint)
	}
	return nil
}

func bitsPerChar(s string) float64 {
	hex, b64 := true, true
	for _, r := range s {
		isHex := r >= '0' && r <= '9' || r >= 'a' && r <= 'f' || r >= 'A' && r <= 'F'
		isB64 := r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || strings.ContainsRune("+/-_=", r)
		hex = hex && isHex
		b64 = b64 && isB64
	}
	switch {
	case hex:
		return 4
	case b64:
		return 6
	default:
		return math.Log2(95)
	}
}
