package outbox_test

import (
	"strings"
	"testing"

	"github.com/compensa/compensa/outbox"
)

func TestCheckJSONB(t *testing.T) {
	t.Parallel()
	ok := []string{
		`{}`, `{"a":"b"}`, `{"a":"\\u0000"}`, `{"e":"\ud83d\ude00"}`, `[1, -2.5e10, 0.000, 1e131071, 1e-16383]`,
		`{"n": 123456789012345678901234567890}`, `"\u00e9"`, `{"z": 0e999999}`,
	}
	for _, s := range ok {
		if err := outbox.CheckJSONB([]byte(s)); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	bad := map[string]string{
		`{"a":"x\u0000"}`:      `\u0000`,
		`{"a":"\ud800"}`:       "surrogate",
		`{"a":"\udc00x"}`:      "surrogate",
		`{"a":"\ud800\ud800"}`: "surrogate",
		`{"a":"\ud800a"}`:      "surrogate",
		`{"n":1e200000}`:       "numeric",
		`{"n":1e-20000}`:       "numeric",
		`{"n":-12.5e131071}`:   "numeric",
		"{\"a\":\"\xff\"}":     "UTF-8",
		`{"a":`:                "JSON",
		``:                     "empty",
		`000`:                  "JSON",
	}
	for s, want := range bad {
		err := outbox.CheckJSONB([]byte(s))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error about %s", s, err, want)
		}
	}
}

func TestCheckEncodable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		json  string
		depth int
		ok    bool
	}{
		{`1`, 0, true},
		{`{"a":[1,{"b":"[[["}]}`, 3, true},
		{`"\"[["`, 0, true},
		{strings.Repeat("[", 10000) + strings.Repeat("]", 10000), 10000, true},
		{strings.Repeat("[", 10001) + strings.Repeat("]", 10001), 10001, false},
		{strings.Repeat(`{"a":`, 12000) + "1" + strings.Repeat("}", 12000), 12000, false},
		{"{\"a\":\"\xff\"}", 1, false},
	} {
		if d := outbox.JSONDepth([]byte(c.json)); d != c.depth {
			t.Errorf("JSONDepth(%.30s) = %d, want %d", c.json, d, c.depth)
		}
		if err := outbox.CheckEncodable([]byte(c.json)); (err == nil) != c.ok {
			t.Errorf("CheckEncodable(%.30s) = %v", c.json, err)
		}
	}
}
