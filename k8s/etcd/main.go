// Command etcd is etcd's own server entry point, built in this module so the
// cluster's etcd comes from the Go module proxy like every other component.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
