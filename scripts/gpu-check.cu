// The CUDA program scripts/gpu-check.sh runs inside a container: it lists the
// GPUs the container sees and has GPU 0 compute something it can check.
// Built as PTX alone (no machine code), so that loading it needs the driver's
// JIT compiler too, one more of the libraries the NVIDIA hook binds.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void add_index(int *values, int count)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count)
        values[i] += i;
}

static int failed(const char *what, cudaError_t error)
{
    printf("cuda-check: %s: %s\n", what, cudaGetErrorString(error));
    return 1;
}

int main()
{
    const int count = 1 << 20;
    static int values[1 << 20];
    int devices = 0, *on_gpu = nullptr, right = 0;
    cudaError_t error;

    if ((error = cudaGetDeviceCount(&devices)) != cudaSuccess)
        return failed("cudaGetDeviceCount", error);
    for (int d = 0; d < devices; d++) {
        cudaDeviceProp properties;
        if ((error = cudaGetDeviceProperties(&properties, d)) != cudaSuccess)
            return failed("cudaGetDeviceProperties", error);
        printf("cuda-check: GPU %d: %s, compute capability %d.%d, %zu MiB\n", d,
               properties.name, properties.major, properties.minor,
               properties.totalGlobalMem >> 20);
    }
    for (int i = 0; i < count; i++)
        values[i] = 2 * i;
    if ((error = cudaMalloc(&on_gpu, sizeof values)) != cudaSuccess)
        return failed("cudaMalloc", error);
    if ((error = cudaMemcpy(on_gpu, values, sizeof values, cudaMemcpyHostToDevice)) != cudaSuccess)
        return failed("cudaMemcpy to the GPU", error);
    add_index<<<(count + 255) / 256, 256>>>(on_gpu, count);
    if ((error = cudaGetLastError()) != cudaSuccess)
        return failed("kernel launch", error);
    if ((error = cudaMemcpy(values, on_gpu, sizeof values, cudaMemcpyDeviceToHost)) != cudaSuccess)
        return failed("cudaMemcpy from the GPU", error);
    for (int i = 0; i < count; i++)
        right += values[i] == 3 * i;
    printf("cuda-check: a kernel on GPU 0 computed %d of %d values right\n", right, count);
    return right == count ? 0 : 1;
}
