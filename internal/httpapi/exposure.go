package httpapi

import (
	"net"
	"strings"
)

// IsLoopback reports whether a listen address ("host:port") accepts
// connections from this machine only: localhost or a loopback IP. An empty
// host (every interface), any other name and any other IP are not: a
// monitor there without a token would show every saga's state to whoever
// can reach it.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
