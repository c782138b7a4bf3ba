// Package check validates the files in deploy/ with the tools' own code: the
// alert rules through Prometheus's model/rulefmt (what `promtool check rules`
// runs) and its PromQL parser; the Helm chart of deploy/helm/compensa through
// Helm's lint and template actions, in both modes, with the rendered objects
// decoded into Kubernetes' API types and checked against the relay's flags.
// It is a module of its own so that the Prometheus, Helm and Kubernetes
// modules stay out of the relay's go.mod; run it with `make deploy-check`.
package check
