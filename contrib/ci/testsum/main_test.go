package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTallyStream(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream string
		want   tally
		ok     bool
	}{{
		name: "passes, skips and subtests",
		stream: `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestB/sub"}
{"Action":"skip","Package":"p","Test":"TestC"}
{"Action":"pass","Package":"p"}`,
		want: tally{Passed: 2, Skipped: 1},
		ok:   true,
	}, {
		name: "a failing test",
		stream: `{"Action":"output","Package":"p","Test":"TestA","Output":"boom\n"}
{"Action":"fail","Package":"p","Test":"TestA"}
{"Action":"fail","Package":"p"}`,
		want: tally{Failed: 1},
	}, {
		name:   "a package that fails without a failing test",
		stream: `{"Action":"pass","Package":"p","Test":"TestA"}` + "\n" + `{"Action":"fail","Package":"q"}`,
		want:   tally{Passed: 1, BrokenPackages: []string{"q"}},
	}, {
		name:   "only skips ran nothing",
		stream: `{"Action":"skip","Package":"p","Test":"TestA"}`,
		want:   tally{Skipped: 1},
	}, {
		name:   "empty stream ran nothing",
		stream: ``,
		want:   tally{},
	}, {
		name:   "not test2json",
		stream: `{"Action":"pass","Package":"p","Test":"TestA"}` + "\n" + `# p: build failed`,
		want:   tally{Passed: 1, StreamError: "not a test2json line: # p: build failed"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := tallyStream("s", strings.NewReader(tc.stream), io.Discard)
			tc.want.Suite = "s"
			if got.Passed != tc.want.Passed || got.Failed != tc.want.Failed || got.Skipped != tc.want.Skipped ||
				strings.Join(got.BrokenPackages, ",") != strings.Join(tc.want.BrokenPackages, ",") ||
				got.StreamError != tc.want.StreamError {
				t.Fatalf("tally = %+v, want %+v", got, tc.want)
			}
			if got.ok() != tc.ok {
				t.Fatalf("ok() = %v, want %v for %+v", got.ok(), tc.ok, got)
			}
		})
	}
}

func TestReport(t *testing.T) {
	results := filepath.Join(t.TempDir(), "results")
	pass := `{"Action":"pass","Package":"p","Test":"TestA"}`
	if err := count("good", results, 0, strings.NewReader(pass), io.Discard); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	ok, err := report(results, &out)
	if err != nil || !ok {
		t.Fatalf("report = %v, %v; want ok\n%s", ok, err, out.String())
	}
	if !strings.Contains(out.String(), "total: 1 passed, 0 failed, 0 skipped\n") {
		t.Fatalf("missing closing line:\n%s", out.String())
	}

	// A suite whose command failed fails the report even with passing tests.
	if err := count("bad-exit", results, 3, strings.NewReader(pass), io.Discard); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	ok, err = report(results, &out)
	if err != nil || ok {
		t.Fatalf("report = %v, %v; want a failure\n%s", ok, err, out.String())
	}
	if !strings.Contains(out.String(), "bad-exit") || !strings.Contains(out.String(), "command exited 3") {
		t.Fatalf("failure not named:\n%s", out.String())
	}
}

func TestReportMissingFile(t *testing.T) {
	if _, err := report(filepath.Join(t.TempDir(), "none"), io.Discard); !os.IsNotExist(err) {
		t.Fatalf("err = %v, want not-exist", err)
	}
}
