// Package nribridge gives the deployment manifests of nri-bridge in this directory
// (static-pod.yaml, daemonset.yaml) to the tests that run and check them, exactly as committed.
package nribridge

import (
	"bytes"
	_ "embed"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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
		return nil, fmt.Errorf("deploy/nri-bridge/static-pod.yaml: %w", err)
	}
	return &pod, nil
}

// ClusterNetwork is what daemonset.yaml applies: nri-bridge's DaemonSet with its ServiceAccount,
// the RBAC it needs and its configuration.
type ClusterNetwork struct {
	ServiceAccount     *corev1.ServiceAccount
	ClusterRole        *rbacv1.ClusterRole
	ClusterRoleBinding *rbacv1.ClusterRoleBinding
	ConfigMap          *corev1.ConfigMap
	DaemonSet          *appsv1.DaemonSet
}

// DaemonSet returns daemonset.yaml.
func DaemonSet() (*ClusterNetwork, error) {
	cn, err := ParseClusterNetwork(daemonSetYAML)
	if err != nil {
		return nil, fmt.Errorf("deploy/nri-bridge/daemonset.yaml: %w", err)
	}
	return cn, nil
}

// ParseClusterNetwork decodes a daemonset.yaml (the committed one, or a release's copy), each
// document as strictly as StaticPod. Each kind must come exactly once, and no other.
func ParseClusterNetwork(data []byte) (*ClusterNetwork, error) {
	cn := &ClusterNetwork{}
	for i, doc := range bytes.Split(data, []byte("\n---\n")) {
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		var object any
		var again bool
		switch meta.APIVersion + " " + meta.Kind {
		case "v1 ServiceAccount":
			object, again = fresh(&cn.ServiceAccount)
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			object, again = fresh(&cn.ClusterRole)
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			object, again = fresh(&cn.ClusterRoleBinding)
		case "v1 ConfigMap":
			object, again = fresh(&cn.ConfigMap)
		case "apps/v1 DaemonSet":
			object, again = fresh(&cn.DaemonSet)
		default:
			return nil, fmt.Errorf("document %d: %s %s is not part of nri-bridge's cluster network", i+1, meta.APIVersion, meta.Kind)
		}
		if again {
			return nil, fmt.Errorf("document %d: a second %s", i+1, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, object); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i+1, meta.Kind, err)
		}
	}
	if cn.ServiceAccount == nil || cn.ClusterRole == nil || cn.ClusterRoleBinding == nil || cn.ConfigMap == nil || cn.DaemonSet == nil {
		return nil, fmt.Errorf("want a ServiceAccount, a ClusterRole, a ClusterRoleBinding, a ConfigMap and a DaemonSet, got %+v", cn)
	}
	return cn, nil
}

// fresh makes *field a new object to decode into, unless it has one already (again).
func fresh[T any](field **T) (object any, again bool) {
	if *field != nil {
		return nil, true
	}
	*field = new(T)
	return *field, false
}
