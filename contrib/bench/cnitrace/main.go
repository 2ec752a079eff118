// Command cnitrace times CNI plugin executions for the benchmark (`make bench`). The benchmark
// points a CNI bin dir entry (e.g. <dir>/bridge) at cnitrace; cnitrace runs the real plugin
// <dir>/real/<name> with the same arguments, environment and standard streams, and appends one
// line per execution to <dir>/trace.log:
//
//	<plugin> <CNI_COMMAND> <nested> <duration ns> <exit code> <CNI_CONTAINERID>
//
// nested is 1 for a plugin run by another plugin (host-local by bridge): its time is part of
// its parent's.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// nestedEnv marks the environment of a traced plugin, so that the plugins it runs are nested.
const nestedEnv = "KNEXT_CNITRACE_NESTED"

func main() {
	dir, name := filepath.Split(os.Args[0])
	nested := 0
	if os.Getenv(nestedEnv) != "" {
		nested = 1
	}
	cmd := exec.Command(filepath.Join(dir, "real", name), os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), nestedEnv+"=1")
	start := time.Now()
	err := cmd.Run()
	elapsed := time.Since(start)
	code := 0
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		code = exitErr.ExitCode()
	case err != nil:
		fmt.Fprintf(os.Stderr, "cnitrace: %s: %v\n", name, err)
		code = 127
	}
	line := fmt.Sprintf("%s %s %d %d %d %s\n", name, os.Getenv("CNI_COMMAND"), nested, elapsed.Nanoseconds(), code, os.Getenv("CNI_CONTAINERID"))
	if f, err := os.OpenFile(filepath.Join(dir, "trace.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		f.WriteString(line) // one write: lines of concurrent plugins do not interleave
		f.Close()
	}
	os.Exit(code)
}
