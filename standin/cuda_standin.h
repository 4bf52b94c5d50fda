/*
 * cuda_standin.h -- minimal CUDA driver API declarations for cudatrace's
 * STAND-IN libcuda (standin/libcuda_standin.c) and the test/demo programs
 * that link against it.  This is NOT NVIDIA's cuda.h; it only declares what
 * the stand-in exports.  The struct layouts below mirror the real cuda.h
 * (x86-64) exactly, because cudatrace's eBPF programs read them by offset;
 * the _Static_asserts at the bottom pin every offset the tracer relies on.
 *
 * Offsets (x86-64, checked by _Static_assert below and by an offsetof
 * printout when this was written):
 *
 *   CUlaunchConfig (size 56):
 *     gridDimX@0 gridDimY@4 gridDimZ@8 blockDimX@12 blockDimY@16
 *     blockDimZ@20 sharedMemBytes@24 hStream@32 attrs@40 numAttrs@48
 *
 *   CUDA_MEMCPY2D (size 128):
 *     srcXInBytes@0 srcY@8 srcMemoryType@16 srcHost@24 srcDevice@32
 *     srcArray@40 srcPitch@48 dstXInBytes@56 dstY@64 dstMemoryType@72
 *     dstHost@80 dstDevice@88 dstArray@96 dstPitch@104 WidthInBytes@112
 *     Height@120
 *
 *   CUDA_MEMCPY3D (size 200):
 *     srcXInBytes@0 srcY@8 srcZ@16 srcLOD@24 srcMemoryType@32 srcHost@40
 *     srcDevice@48 srcArray@56 reserved0@64 srcPitch@72 srcHeight@80
 *     dstXInBytes@88 dstY@96 dstZ@104 dstLOD@112 dstMemoryType@120
 *     dstHost@128 dstDevice@136 dstArray@144 reserved1@152 dstPitch@160
 *     dstHeight@168 WidthInBytes@176 Height@184 Depth@192
 *
 *   CUmemAllocationProp (size 32): type@0 requestedHandleTypes@4
 *     location@8 (type@8 id@12) win32HandleMetaData@16 allocFlags@24
 *   CUmemAccessDesc (size 12): location@0 (type@0 id@4) flags@8
 *   CUlaunchAttribute (size 72): id@0 value@8
 */
#ifndef CUDATRACE_CUDA_STANDIN_H
#define CUDATRACE_CUDA_STANDIN_H

#include <stddef.h>

/* ---- scalar and handle types ------------------------------------------ */

typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910
} CUresult;

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUkern_st *CUkernel;
typedef struct CUlib_st *CUlibrary;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
/* Only passed by pointer. */
typedef struct CUmemcpyAttributes_st CUmemcpyAttributes;

typedef enum CUmemorytype_enum {
    CU_MEMORYTYPE_HOST = 0x01,
    CU_MEMORYTYPE_DEVICE = 0x02,
    CU_MEMORYTYPE_ARRAY = 0x03,
    CU_MEMORYTYPE_UNIFIED = 0x04
} CUmemorytype;

/* Only used as pointer/opaque argument types; int-sized enums in cuda.h. */
typedef int CUjit_option;
typedef int CUlibraryOption;
typedef int CUdriverProcAddressQueryResult;

#define CU_GET_PROC_ADDRESS_DEFAULT 0x0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 0x1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 0x2
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2

/* ---- structs with real layouts ----------------------------------------- */

typedef union CUlaunchAttributeValue_union {
    char pad[64];
} CUlaunchAttributeValue;

typedef struct CUlaunchAttribute_st {
    int id; /* CUlaunchAttributeID */
    char pad[8 - sizeof(int)];
    CUlaunchAttributeValue value;
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

typedef struct CUDA_MEMCPY2D_st {
    size_t srcXInBytes;
    size_t srcY;
    CUmemorytype srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    size_t srcPitch;
    size_t dstXInBytes;
    size_t dstY;
    CUmemorytype dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    size_t dstPitch;
    size_t WidthInBytes;
    size_t Height;
} CUDA_MEMCPY2D;

typedef struct CUDA_MEMCPY3D_st {
    size_t srcXInBytes;
    size_t srcY;
    size_t srcZ;
    size_t srcLOD;
    CUmemorytype srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    void *reserved0;
    size_t srcPitch;
    size_t srcHeight;
    size_t dstXInBytes;
    size_t dstY;
    size_t dstZ;
    size_t dstLOD;
    CUmemorytype dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    void *reserved1;
    size_t dstPitch;
    size_t dstHeight;
    size_t WidthInBytes;
    size_t Height;
    size_t Depth;
} CUDA_MEMCPY3D;

typedef struct CUmemLocation_st {
    int type; /* CUmemLocationType */
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

/* CUmemLocationType */
#define CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define CU_MEM_LOCATION_TYPE_HOST 0x2
#define CU_MEM_LOCATION_TYPE_HOST_NUMA 0x3
#define CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT 0x4

#define CU_IPC_HANDLE_SIZE 64
/* Passed BY VALUE to cuIpcOpenMemHandle: a 64-byte struct goes on the stack (SysV). */
typedef struct CUipcMemHandle_st {
    char reserved[CU_IPC_HANDLE_SIZE];
} CUipcMemHandle;
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1

typedef enum CUmem_advise_enum {
    CU_MEM_ADVISE_SET_READ_MOSTLY = 1,
    CU_MEM_ADVISE_UNSET_READ_MOSTLY = 2,
    CU_MEM_ADVISE_SET_PREFERRED_LOCATION = 3,
    CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION = 4,
    CU_MEM_ADVISE_SET_ACCESSED_BY = 5,
    CU_MEM_ADVISE_UNSET_ACCESSED_BY = 6
} CUmem_advise;

typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    unsigned long long flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out; /* CUgraphInstantiateResult: 0 success, 1 error */
} CUDA_GRAPH_INSTANTIATE_PARAMS;

typedef struct CUgraphExecUpdateResultInfo_st {
    int result; /* CUgraphExecUpdateResult: 0 success, 1 error */
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;

/* ---- layout checks (x86-64 LP64) ---------------------------------------- */

#define CT_ASSERT_OFF(T, f, off) \
    _Static_assert(offsetof(T, f) == (off), #T "." #f " must be at " #off)

CT_ASSERT_OFF(CUlaunchConfig, gridDimX, 0);
CT_ASSERT_OFF(CUlaunchConfig, gridDimY, 4);
CT_ASSERT_OFF(CUlaunchConfig, gridDimZ, 8);
CT_ASSERT_OFF(CUlaunchConfig, blockDimX, 12);
CT_ASSERT_OFF(CUlaunchConfig, blockDimY, 16);
CT_ASSERT_OFF(CUlaunchConfig, blockDimZ, 20);
CT_ASSERT_OFF(CUlaunchConfig, sharedMemBytes, 24);
CT_ASSERT_OFF(CUlaunchConfig, hStream, 32);
CT_ASSERT_OFF(CUlaunchConfig, attrs, 40);
CT_ASSERT_OFF(CUlaunchConfig, numAttrs, 48);
_Static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig size");

CT_ASSERT_OFF(CUDA_MEMCPY2D, srcMemoryType, 16);
CT_ASSERT_OFF(CUDA_MEMCPY2D, srcHost, 24);
CT_ASSERT_OFF(CUDA_MEMCPY2D, srcDevice, 32);
CT_ASSERT_OFF(CUDA_MEMCPY2D, dstMemoryType, 72);
CT_ASSERT_OFF(CUDA_MEMCPY2D, dstHost, 80);
CT_ASSERT_OFF(CUDA_MEMCPY2D, dstDevice, 88);
CT_ASSERT_OFF(CUDA_MEMCPY2D, WidthInBytes, 112);
CT_ASSERT_OFF(CUDA_MEMCPY2D, Height, 120);
_Static_assert(sizeof(CUDA_MEMCPY2D) == 128, "CUDA_MEMCPY2D size");

CT_ASSERT_OFF(CUDA_MEMCPY3D, srcMemoryType, 32);
CT_ASSERT_OFF(CUDA_MEMCPY3D, srcHost, 40);
CT_ASSERT_OFF(CUDA_MEMCPY3D, srcDevice, 48);
CT_ASSERT_OFF(CUDA_MEMCPY3D, dstMemoryType, 120);
CT_ASSERT_OFF(CUDA_MEMCPY3D, dstHost, 128);
CT_ASSERT_OFF(CUDA_MEMCPY3D, dstDevice, 136);
CT_ASSERT_OFF(CUDA_MEMCPY3D, WidthInBytes, 176);
CT_ASSERT_OFF(CUDA_MEMCPY3D, Height, 184);
CT_ASSERT_OFF(CUDA_MEMCPY3D, Depth, 192);
_Static_assert(sizeof(CUDA_MEMCPY3D) == 200, "CUDA_MEMCPY3D size");

CT_ASSERT_OFF(CUmemAllocationProp, location, 8);
CT_ASSERT_OFF(CUmemAllocationProp, win32HandleMetaData, 16);
CT_ASSERT_OFF(CUmemAllocationProp, allocFlags, 24);
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp size");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc size");
CT_ASSERT_OFF(CUlaunchAttribute, value, 8);
_Static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute size");
_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation size: one register");
_Static_assert(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle size");
CT_ASSERT_OFF(CUDA_GRAPH_INSTANTIATE_PARAMS, hUploadStream, 8);
CT_ASSERT_OFF(CUDA_GRAPH_INSTANTIATE_PARAMS, result_out, 24);
_Static_assert(sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS) == 32, "instantiate params size");
_Static_assert(sizeof(CUgraphExecUpdateResultInfo) == 24, "update result info size");

/* ---- exported functions (real driver signatures) ------------------------ */

/* init / device / context */
CUresult cuInit(unsigned int Flags);
CUresult cuDriverGetVersion(int *driverVersion);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *pctx, void *paramsArray, int numParams,
                        unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams,
                        unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxSynchronize(void);
CUresult cuCtxSynchronize_v2(CUcontext ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                             unsigned long long flags,
                             CUdriverProcAddressQueryResult *symbolStatus);

/* memory */
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                            size_t Height, unsigned int ElementSizeBytes);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                      CUmemoryPool pool, CUstream hStream);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemFreeHost(void *p);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

/* virtual memory management */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                             CUdeviceptr addr, unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                        size_t count);

/* copies and memsets */
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                            CUstream hStream);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                              CUstream hStream);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost,
                                   size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                              CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                   CUstream hStream);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                              CUstream hStream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                   size_t ByteCount, CUstream hStream);
CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                      CUcontext srcContext, size_t ByteCount);
CUresult cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                           CUcontext srcContext, size_t ByteCount);
CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                           CUcontext srcContext, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext,
                                CUdeviceptr srcDevice, CUcontext srcContext,
                                size_t ByteCount, CUstream hStream);
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream);
CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *pCopy, CUstream hStream);
CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *pCopy);
CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *pCopy);
CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *pCopy, CUstream hStream);
CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *pCopy, CUstream hStream);
CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N);
CUresult cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N);
CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N);
CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N);
CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream);
CUresult cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                              CUstream hStream);
CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                               CUstream hStream);

/* launches */
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX,
                             unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream,
                             void **kernelParams, void **extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                               void **kernelParams, void **extra);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                        unsigned int gridDimY, unsigned int gridDimZ,
                                        unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                                        CUstream hStream, void **kernelParams);
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuStreamBeginCapture(CUstream hStream);
CUresult cuStreamBeginCapture_v2(CUstream hStream, unsigned int mode);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, unsigned int mode);
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);

/* streams / events / sync */
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuStreamSynchronize_ptsz(CUstream hStream);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags);
CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags);
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority);
CUresult cuStreamQuery(CUstream hStream);
CUresult cuStreamQuery_ptsz(CUstream hStream);
CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
CUresult cuEventQuery(CUevent hEvent);
CUresult cuEventDestroy_v2(CUevent hEvent);

/* memory shared between processes, unified memory hints */
CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                            CUstream hStream);
CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                 CUstream hStream);
CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                               unsigned int flags, CUstream hStream);
CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                    unsigned int flags, CUstream hStream);
CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device);
CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                        CUmemLocation location);

/* graphs */
CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags);
CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                              CUgraphExecUpdateResultInfo *resultInfo);

/* copy batches */
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                            CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
                            size_t *failIdx, CUstream hStream);
CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                               size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
                               size_t numAttrs, CUstream hStream);
CUresult cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                    size_t count, CUmemcpyAttributes *attrs,
                                    size_t *attrsIdxs, size_t numAttrs, CUstream hStream);

/* modules / libraries / kernels */
CUresult cuModuleLoad(CUmodule *module, const char *fname);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                            CUjit_option *options, void **optionValues);
CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin);
CUresult cuModuleUnload(CUmodule hmod);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                           void **jitOptionsValues, unsigned int numJitOptions,
                           CUlibraryOption *libraryOptions, void **libraryOptionValues,
                           unsigned int numLibraryOptions);
CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
                               CUjit_option *jitOptions, void **jitOptionsValues,
                               unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                               void **libraryOptionValues, unsigned int numLibraryOptions);
CUresult cuLibraryUnload(CUlibrary library);
CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name);
CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel);

/* marker: present only in the stand-in, never in NVIDIA's libcuda */
extern const char cudatrace_standin_libcuda[];

#endif /* CUDATRACE_CUDA_STANDIN_H */
