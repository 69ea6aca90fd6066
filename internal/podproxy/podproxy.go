// Package podproxy holds what a client reading an exporter through the API server's pod proxy
// (pods/proxy) and the exporter agree on. It imports nothing, so the kubectl plugin can use it
// without the exporter's dependencies (internal/kubeauth brings the Prometheus client and the
// collectors).
package podproxy

// TokenHeader carries a bearer token where the Authorization header cannot: the API server's
// pod proxy removes Authorization from every request it has authenticated, whatever its user
// authenticated with.
const TokenHeader = "X-Proxyhealth-Token"
