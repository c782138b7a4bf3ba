package httpapi

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/compensa/compensa/saga"
	"github.com/compensa/compensa/saga/admin"
)

// A COMPENSATED instance's reason is an expected outcome, not an error: the
// list shows it in the text's colour (class expected), a FAILED one's in
// red (class err).
func TestCompensatedReasonIsNotAnError(t *testing.T) {
	t.Parallel()
	data := indexData{Recent: []admin.Item{
		{ID: uuid.New(), SagaName: "order", SagaVersion: 1, Status: saga.StatusCompensated, Reason: "card declined"},
		{ID: uuid.New(), SagaName: "order", SagaVersion: 1, Status: saga.StatusFailed, Reason: "refund refused"},
	}}
	var buf bytes.Buffer
	if err := indexView(data).Render(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	html := buf.String()
	if !strings.Contains(html, `<td class="expected" data-field="reason">card declined</td>`) {
		t.Errorf("the COMPENSATED reason is not shown as expected:\n%s", html)
	}
	if !strings.Contains(html, `<td class="err" data-field="reason">refund refused</td>`) {
		t.Errorf("the FAILED reason is not shown as an error")
	}
}
