// Command nnp is the entrypoint of critest's registry.k8s.io/e2e-test-images/nonewprivs image,
// rebuilt here: installed setuid root, it prints the effective user ID it runs with, so that
// critest sees whether the runtime's no_new_privs flag kept the setuid bit from taking effect.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Printf("Effective uid: %d\n", os.Geteuid())
}
