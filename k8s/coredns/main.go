// Command coredns is CoreDNS's own main with its standard plugin set, built as a module of
// its own (apart from k8s/, whose dependency graph is Kubernetes') so the lab's cluster DNS
// and agnhost's /coredns come from the Go module proxy like every other component.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/core/plugin" // every plugin of the standard build
)

func main() {
	coremain.Run()
}
