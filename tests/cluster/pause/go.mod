// The test cluster's Pod sandbox process (containerd's sandbox_image): no registry is reachable,
// so scripts/cluster builds this and imports it as an image.
module kvcache.test/pause

go 1.26.0
