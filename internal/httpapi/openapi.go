package httpapi

import (
	_ "embed"
	"net/http"

	"github.com/compensa/compensa/saga/admin"
)

// openAPIDoc is the OpenAPI 3.1 description of /v1, kept in the repository
// (internal/httpapi/openapi/openapi.json); a test checks that it describes
// every route and that real answers match its schemas.
//
//go:embed openapi/openapi.json
var openAPIDoc []byte

func (s *Server) openAPI(w http.ResponseWriter, _ *http.Request, _ *admin.Admin) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openAPIDoc)
}
