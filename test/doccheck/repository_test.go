package doccheck

import "testing"

// repositoryRoot is this checkout, from this package's directory.
const repositoryRoot = "../.."

func openRepository(t *testing.T) *Repository {
	t.Helper()
	r, err := OpenRepository(repositoryRoot)
	if err != nil {
		t.Fatal(err)
	}
	if r.pageAt("README.md") == nil || len(r.series) == 0 {
		t.Fatalf("%s holds no README.md or no patch series: not the repository", repositoryRoot)
	}
	return r
}

func TestPagesLinkToWhatExists(t *testing.T) {
	for _, problem := range openRepository(t).BrokenLinks() {
		t.Error(problem)
	}
}

func TestPagesCitePathsThatExist(t *testing.T) {
	for _, problem := range openRepository(t).BrokenCitations() {
		t.Error(problem)
	}
}

func TestSeriesTableListsThePatchFiles(t *testing.T) {
	problems, err := openRepository(t).SeriesTableProblems()
	if err != nil {
		t.Fatal(err)
	}
	for _, problem := range problems {
		t.Error(problem)
	}
}

// A directory of upstreamDirs that this repository also had would hide broken citations of our
// own files there: rename ours, or drop the entry and cite upstream's paths differently.
func TestUpstreamDirsAreNotOurs(t *testing.T) {
	r := openRepository(t)
	for _, d := range upstreamDirs {
		if r.inRepository(d) {
			t.Errorf("%s is in upstreamDirs, but the repository has it", d)
		}
	}
}
