// Package check validates the files in deploy/ with Prometheus's own code:
// the alert rules through model/rulefmt (what `promtool check rules` runs),
// every expression through the PromQL parser. It is a module of its own so
// that the Prometheus module stays out of the relay's go.mod; run it with
// `make deploy-check`.
package check
