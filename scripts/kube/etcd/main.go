// Command etcd is etcd's server, built from the go.etcd.io/etcd/server/v3 module
// (the same entry point as etcd's own binary), for when Debian's etcd is too old.
// kube-apiserver 1.37 runs on Debian's etcd 3.4.23 as well; see ../README.md.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
