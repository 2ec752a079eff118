// Package nribridge gives the deployment manifests of nri-bridge in this directory
// (static-pod.yaml, daemonset.yaml) to the tests that run and check them, exactly as committed.
package nribridge

import (
	_ "embed"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// ImagePlaceholder is the image of both manifests; `make release` writes the release's tag in
// place of VERSION.
const ImagePlaceholder = "knext.local/nri-bridge:VERSION"

var (
	//go:embed static-pod.yaml
	staticPodYAML []byte
	//go:embed daemonset.yaml
	daemonSetYAML []byte
)

// StaticPod returns static-pod.yaml. Decoding is strict: a field the Pod API does not have (a typo
// the kubelet would silently drop) is an error.
func StaticPod() (*corev1.Pod, error) {
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(staticPodYAML, &pod); err != nil {
		return nil, fmt.Errorf("contrib/nri-bridge/static-pod.yaml: %w", err)
	}
	return &pod, nil
}

// DaemonSet returns daemonset.yaml, decoded as strictly as StaticPod.
func DaemonSet() (*appsv1.DaemonSet, error) {
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(daemonSetYAML, &ds); err != nil {
		return nil, fmt.Errorf("contrib/nri-bridge/daemonset.yaml: %w", err)
	}
	return &ds, nil
}
