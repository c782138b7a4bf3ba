package httpapi

import (
	"fmt"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MinTokenBits is the least entropy a token must carry: 32 hex characters
// or 22 base64 characters. Below that, guessing is a matter of time, and a
// short token also turns log redaction into a hint (masking every "a" in
// every message gives the token "a" away).
const MinTokenBits = 128

// MakeTokenHint is how the error tells the operator to make a good token.
const MakeTokenHint = "make one with: openssl rand -hex 32"

// CheckTokenStrength refuses a token whose estimated entropy is below
// MinTokenBits. The estimate (estimateBits) charges each character the bits
// of the smallest alphabet the whole token fits (hex 4, base64 6, printable
// ASCII 6.5), except that a stretch repeating an earlier part of the token
// (4 characters or more) costs only what pointing back at it would, and a
// run of consecutive or equal characters ("0123456789", "aaaa") costs one
// bit per character past its fourth. A token with fewer than 9 distinct
// characters is refused too (a random one of the least accepted length
// uses more with a probability above 1 - 1e-9). what names the token in
// the message, e.g. "--api-token" or "tokens.yaml:3:10: token". Every place
// that accepts a token (the flag, a token file) calls it.
//
// A random token of the least accepted length holds, by chance, a repeated
// 4-character part or a short run about once in 150 tokens, which the
// estimate charges as if it were made by hand. So the token's length must
// carry MinTokenBits in its alphabet, and the estimate may fall short of
// them by coincidenceSlack: a random token is refused less than once in a
// hundred million, a made-up one still is.
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
	distinct := map[rune]bool{}
	for _, r := range token {
		distinct[r] = true
	}
	nominal := float64(utf8.RuneCountInString(token)) * bitsPerChar(token)
	if nominal < MinTokenBits || estimateBits(token) < MinTokenBits-coincidenceSlack || len(distinct) < 9 {
		return fmt.Errorf("%s is too weak: it must carry at least %d random bits (32 random hex or 22 random base64 characters, without repeated parts or runs such as 0123456789); %s", what, MinTokenBits, MakeTokenHint)
	}
	return nil
}

// coincidenceSlack is how far a token's estimate may fall short of
// MinTokenBits (see CheckTokenStrength).
const coincidenceSlack = 24

// minRepeat is the shortest earlier part whose repetition is charged as a
// back-reference rather than as new characters.
const minRepeat = 4

// estimateBits estimates a token's entropy; see CheckTokenStrength.
func estimateBits(token string) float64 {
	s := []rune(token)
	perChar := bitsPerChar(token)
	// A back-reference names where and how long: about 2·log2(len) bits.
	ref := 2 * math.Log2(float64(len(s))+1)
	bits := 0.0
	run, dir := 1, 0 // the current run of consecutive or equal characters
	for i := 0; i < len(s); {
		if n := longestEarlier(s, i); n >= minRepeat {
			bits += ref
			i += n
			run, dir = 1, 0
			continue
		}
		if i > 0 {
			d := int(s[i]) - int(s[i-1])
			if d >= -1 && d <= 1 && (run == 1 || d == dir) {
				run, dir = run+1, d
			} else {
				run, dir = 1, 0
			}
		}
		if run > minRepeat {
			bits++
		} else {
			bits += perChar
		}
		i++
	}
	return bits
}

// longestEarlier is the length of the longest prefix of s[i:] that also
// starts at an earlier position (the match may overlap i, as "abcabcabc"
// repeats "abc").
func longestEarlier(s []rune, i int) int {
	best := 0
	for j := 0; j < i; j++ {
		n := 0
		for i+n < len(s) && s[j+n] == s[i+n] {
			n++
		}
		best = max(best, n)
	}
	return best
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
