// Runs shaders/rms_norm_backward.cu on the CPU (cuda.TestKernelsOnCPU): each
// launch's blocks run in turn on the block size the host gives the dim
// (cuda/geometry.go classOf: 32..512 threads), its threads as fibers
// (emu_shim.h), with real barriers, warp
// shuffles through a per-warp exchange, CUDA's round-to-nearest intrinsics
// as plain IEEE float operations. It checks r, dx, dw against a double
// reference and that the fused entry (RMSInv+DX+DW; in its width class's
// fused kernel and, where it applies, on the shared-memory path) gives
// bitwise the bits of the three run as separate launches of the general
// kernel, with groups of many rows and with a job in one group (which
// stores dw itself). Exit status 1 on any failure.
#include <random>
#include <string>
#include "emu_shim.h"
using std::size_t;
using std::min;
#define RMS_EMU 1
float4 rms_dyn[232448 / 16]; // dynamic shared memory (blocks run one at a time)
// cp.async of the shared-memory slot paths (emu_shim.h): late unless the
// command line says eager.
inline void cp_async16(float* s, const float* g) { emu_cp16(s, g); }
inline void cp_async_commit() { emu_cp_commit(); }
inline void cp_async_wait(int n) { emu_cp_wait(n); }
#include RMS_CU

// classOf is cuda/geometry.go's: the fused class of a dim in chunks of cw
// elements (-1: none) and the block size of its rows.
struct Class { int cw, k, maxNch; };
// K from the .cu's class macros (RMS_Cc_K: a class geometry variant,
// RMSGRAD_CUDA_CLASS_GEOM, changes them with K*MAXT, so maxNch, kept).
// c4's blocks would hold 1280 chunks; it takes rows of up to 1088 (4352),
// c5 the rest. c7's would hold 256; it takes 128 (1024), c12 the rest.
// The first class in order (cuda/geometry.go's classOrder: c12 between c7
// and c8) that holds a row takes it.
const int order[13]={0,1,2,3,4,5,6,7,12,8,9,10,11};
// EMU_Cc_NCH moves a class's widest row as RMSGRAD_CUDA_CLASS_GEOM's "/N"
// (and a device profile's) does.
#ifndef EMU_C4_NCH
#define EMU_C4_NCH 1088
#endif
#ifndef EMU_C7_NCH
#define EMU_C7_NCH 128
#endif
const Class classes[13]={{4,RMS_C0_K,256},{4,RMS_C1_K,512},{4,RMS_C2_K,768},{4,RMS_C3_K,1024},{4,RMS_C4_K,EMU_C4_NCH},{4,RMS_C5_K,1536},{4,RMS_C6_K,2048},{8,RMS_C7_K,EMU_C7_NCH},{8,RMS_C8_K,512},{8,RMS_C9_K,640},{8,RMS_C10_K,768},{8,RMS_C11_K,1024},{8,RMS_C12_K,256}};
void classOf(int dim, int cw, int& cls, int& threads){
  cls=-1; threads=256;
  if(dim<=0 || dim%cw) return;
  int nch=dim/cw;
  for(int i=0;i<13;i++){ int c=order[i]; if(classes[c].cw==cw && nch<=classes[c].maxNch){ int t=(nch+classes[c].k-1)/classes[c].k; cls=c; threads=(t+31)/32*32; return; } }
}
typedef void (*Kern)(const Job*, const int*);
// By class; a half class's BF16 kernel, its F16 kernel in fusedF16Kernels
// (cuda/plan.go entry.kernel).
const Kern fusedKernels[13]={rms_norm_backward_rows_fused_c0,rms_norm_backward_rows_fused_c1,rms_norm_backward_rows_fused_c2,
  rms_norm_backward_rows_fused_c3,rms_norm_backward_rows_fused_c4,rms_norm_backward_rows_fused_c5,
  rms_norm_backward_rows_fused_c6,rms_norm_backward_rows_fused_c7,rms_norm_backward_rows_fused_c8,
  rms_norm_backward_rows_fused_c9,rms_norm_backward_rows_fused_c10,rms_norm_backward_rows_fused_c11,
  rms_norm_backward_rows_fused_c12};
const Kern fusedF16Kernels[6]={rms_norm_backward_rows_fused_c7_f16,rms_norm_backward_rows_fused_c8_f16,rms_norm_backward_rows_fused_c9_f16,
  rms_norm_backward_rows_fused_c10_f16,rms_norm_backward_rows_fused_c11_f16,rms_norm_backward_rows_fused_c12_f16};
// goJobs launches jobs (one dim) as the host does: the rows kernel the host
// picks (cuda/plan.go entry.kernel) with the dim's block size (256 with
// shared-memory slots), then the reduction for the jobs of several groups.
// forced is RMSGRAD_CUDA_STAGES: 256 threads, the general kernel.
void goJobs(std::vector<Job>& jobs, int dim, int nred, bool forced){
  std::vector<int> bm, bmr; int s=0, rs=0;
  for(size_t i=0;i<jobs.size();i++){ jobs[i].start=s; jobs[i].rstart=rs; for(int k=0;k<jobs[i].g;k++) bm.push_back(i); s+=jobs[i].g;
    if((jobs[i].flags&F_DW) && jobs[i].g>1){ for(int k=0;k<nred;k++) bmr.push_back(i); rs+=nred; } }
  // Chunks of 8 for half x; RMSGRAD_CUDA_STAGES only for F32 x.
  int cw=rows_cw(jobs[0]);
  int cls, T; classOf(dim, cw, cls, T);
  if(forced && cw==4){ cls=-1; T=256; }
  bool fusedK = cls>=0 && jobs[0].flags==(F_COMPUTE_R|F_WRITE_R|F_DX|F_DW) && TYPE_IO(jobs[0])!=T_ANY;
  if(fusedK){ Kern k = TYPE_IO(jobs[0])==T_F16 ? fusedF16Kernels[cls-7] : fusedKernels[cls]; launch(s,T,[&]{ k(jobs.data(), bm.data()); }); }
  else launch(s,T,[&]{ rms_norm_backward_rows_f32(jobs.data(), bm.data()); });
  if(rs) launch(rs,RED_SL*RED_CH,[&]{ rms_norm_dw_reduce_f32(jobs.data(), bmr.data()); });
}
struct Case { int rows, dim, gmax; };
int fails=0;
// run: entries built from flags; returns r,dx,dw
// mode 0: fused on the register path (the dim's class and block size); 1:
// fused on the shared-memory path as RMSGRAD_CUDA_STAGES takes it (256
// threads); 2: RMSInv, DX, DW as three launches of the general kernel with
// the dim's block size; 3: the same with 256 threads, RMSInv and DW on the
// shared-memory path, DX on the register path (a half-precision entry of
// that dim gets no slots).
void run(int rows,int dim,int gmax,int mode,std::vector<float>&x,std::vector<float>&w,std::vector<float>&dy,
         std::vector<float>&r,std::vector<float>&dx,std::vector<float>&dw){
  int rg=(rows+gmax-1)/gmax, g=(rows+rg-1)/rg;
  std::vector<float> part((size_t)g*dim, NAN);
  r.assign(rows,NAN); dx.assign((size_t)rows*dim,NAN); dw.assign(dim,NAN);
  int nch=(dim+3)/4;
  int st = (dim%4==0 && nch<=256*8) ? std::min(3, rg) : 0;
  auto mk=[&](int flags, int stages){ Job J{}; J.stages=stages; J.x=x.data(); J.w=w.data(); J.dy=dy.data(); J.r=r.data(); J.dx=dx.data(); J.part=part.data(); J.dw=dw.data();
    J.rows=rows; J.dim=dim; J.rg=rg; J.g=g; J.flags=flags; J.eps=1e-5f; J.start=0; J.rstart=0; return J;};
  int nred=((dim+3)/4+RED_CH-1)/RED_CH;
  bool forced = mode==1 || mode==3;
  auto go=[&](std::vector<Job> jobs){ goJobs(jobs, dim, nred, forced); };
  if(mode==0) go({mk(F_COMPUTE_R|F_WRITE_R|F_DX|F_DW, 0)});
  else if(mode==1) go({mk(F_COMPUTE_R|F_WRITE_R|F_DX|F_DW, st)});
  else if(mode==2) { go({mk(F_COMPUTE_R|F_WRITE_R, 0)}); go({mk(F_DX, 0)}); go({mk(F_DW, 0)}); }
  else { go({mk(F_COMPUTE_R|F_WRITE_R, st)}); go({mk(F_DX, 0)}); go({mk(F_DW, st)}); }
}
// Dtype mixes: the same launches over buffers of BF16/F16/F32 elements.
typedef std::vector<unsigned char> bytes;
struct Types { int x, w, dy, dx, dw; };
// ioOf is cuda/plan.go's entry.io: the dtype x, dy and dx share, or T_ANY.
int ioOf(int flags, Types t){
  bool dy = flags & (F_DX|F_DW), dx = flags & F_DX;
  if((dy && t.dy != t.x) || (dx && t.dx != t.x)) return T_ANY;
  return t.x;
}
int typesWord(int flags, Types t){ return t.x | t.w<<2 | t.dy<<4 | t.dx<<6 | t.dw<<8 | ioOf(flags,t)<<10; }
size_t tsz(int dt){ return dt==T_F32 ? 4 : 2; }
float dec(const bytes& b, size_t i, int dt){
  if(dt==T_F32){ float f; std::memcpy(&f,&b[4*i],4); return f; }
  unsigned h = b[2*i] | (b[2*i+1]<<8);
  return dt==T_BF16 ? bf2f(h) : h2f(h);
}
bytes enc(const std::vector<float>& v, int dt){
  bytes b(v.size()*tsz(dt));
  for(size_t i=0;i<v.size();i++){
    if(dt==T_F32){ std::memcpy(&b[4*i],&v[i],4); continue; }
    unsigned short h = dt==T_BF16 ? f2bf(v[i]) : f2h(v[i]);
    b[2*i]=h&0xff; b[2*i+1]=h>>8;
  }
  return b;
}
// roundTo rounds v to nearest even in a format of p significant bits and
// smallest normal exponent emin (independently of the kernel's code).
double roundTo(double v, int p, int emin){
  if(v==0 || std::isnan(v) || std::isinf(v)) return v;
  int e; std::frexp(v,&e); e = std::max(e-1, emin);
  double q = std::ldexp(1.0, e-(p-1));
  return std::nearbyint(v/q)*q; // the default rounding mode is to nearest even
}
double ulpOf(double v, int dt){
  if(dt==T_F32) return 0;
  int p = dt==T_BF16 ? 8 : 11, emin = dt==T_BF16 ? -126 : -14;
  int e = emin; if(v!=0){ std::frexp(v,&e); e = std::max(e-1, emin); }
  return std::ldexp(1.0, e-(p-1));
}
double roundOut(double v, int dt){
  if(dt==T_F32) return (float)v;
  return dt==T_BF16 ? roundTo(v,8,-126) : roundTo(v,11,-14);
}
// runT is run for dtype mixes: mode 0 fused (registers), 1 fused with
// shared-memory slots where the host would give them (x and dy F32), 2
// RMSInv, DX and DW apart.
void runT(int rows,int dim,int gmax,int mode,Types ty,const bytes& x,const bytes& w,const bytes& dy,
          std::vector<float>& r,bytes& dx,bytes& dw){
  int rg=(rows+gmax-1)/gmax, g=(rows+rg-1)/rg;
  std::vector<float> part((size_t)g*dim, NAN);
  r.assign(rows,NAN); dx.assign((size_t)rows*dim*tsz(ty.dx),0xff); dw.assign((size_t)dim*tsz(ty.dw),0xff);
  int nch=(dim+3)/4;
  int st = (dim%4==0 && nch<=256*8 && ty.x==T_F32 && ty.dy==T_F32) ? std::min(3, rg) : 0;
  auto mk=[&](int flags, int stages){ Job J{}; J.stages=stages; J.x=x.data(); J.w=w.data(); J.dy=dy.data(); J.r=r.data(); J.dx=dx.data(); J.part=part.data(); J.dw=dw.data();
    J.rows=rows; J.dim=dim; J.rg=rg; J.g=g; J.flags=flags; J.eps=1e-5f; J.types=typesWord(flags, ty); return J;};
  int nred=((dim+3)/4+RED_CH-1)/RED_CH;
  bool forced = mode==1 || mode==3;
  auto go=[&](std::vector<Job> jobs){ goJobs(jobs, dim, nred, forced); };
  if(mode==0) go({mk(F_COMPUTE_R|F_WRITE_R|F_DX|F_DW, 0)});
  else if(mode==1) go({mk(F_COMPUTE_R|F_WRITE_R|F_DX|F_DW, st)});
  else if(mode==2) { go({mk(F_COMPUTE_R|F_WRITE_R, 0)}); go({mk(F_DX, 0)}); go({mk(F_DW, 0)}); }
  else { go({mk(F_COMPUTE_R|F_WRITE_R, st)}); go({mk(F_DX, 0)}); go({mk(F_DW, st)}); }
}
struct MixCase { int rows, dim, gmax; Types t; };
const char* tname(int dt){ return dt==T_F32?"f32":dt==T_BF16?"bf16":"f16"; }
// mixCases: every IO path (typed BF16/F16 register, wide and fused
// kernels; T_ANY on the register and streaming paths; shared-memory slots
// with half w and dx) against a double reference, fused against apart bit
// for bit, and every half output the F32 output of the same job rounded
// once to nearest even.
// halfOnly: only the cases of class c9's fused kernel (x, dy and dx of one
// half dtype, dim a multiple of 8 over 4096 up to 5120), for the
// RMS_C9_SLOTS variant.
int runMixes(std::mt19937& rng, bool halfOnly){
  std::uniform_real_distribution<float> U(-1,1);
  std::vector<MixCase> cs={
    {7,257,3,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    {40,1024,6,{T_F16,T_F16,T_F16,T_F16,T_F16}},
    {9,8192,4,{T_BF16,T_F32,T_BF16,T_BF16,T_F32}},
    {6,5120,2,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    {5,9000,2,{T_F16,T_BF16,T_BF16,T_F32,T_F16}},
    {33,2048,5,{T_F16,T_F32,T_BF16,T_F16,T_BF16}},
    {3,4100,2,{T_F32,T_BF16,T_F32,T_BF16,T_BF16}},
    {8,1024,1,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    {3,5120,1,{T_BF16,T_F32,T_BF16,T_F32,T_F32}},
    {4,6144,2,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    {2,1152,1,{T_F16,T_F16,T_F16,T_F16,T_F32}},
    {2,9000,1,{T_F16,T_F32,T_F16,T_F16,T_BF16}},
    // Chunks of 8 (half x): a dim that is no multiple of 8 (general kernel,
    // 8-byte pieces), the smallest c7 block (96 threads), c7 with w in
    // shared memory over groups of several rows, x half with dy F32 (T_ANY
    // in chunks of 8), and c6.
    {5,1028,2,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    {6,2176,2,{T_BF16,T_F32,T_BF16,T_BF16,T_F32}},
    {9,4096,2,{T_F16,T_F16,T_F16,T_F16,T_F16}},
    {5,4096,2,{T_BF16,T_F32,T_F32,T_BF16,T_F32}},
    {7,2048,2,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    {3,4104,1,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    // c8 with groups of many rows, its smallest dim, and rows fewer than
    // the rows in registers; c9 with groups of many rows (every slot of
    // RMS_C9_SLOTS reused) and its smallest dim.
    {37,4096,5,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    {21,8192,2,{T_F16,T_F32,T_F16,T_F16,T_F32}},
    {11,3968,1,{T_BF16,T_F32,T_BF16,T_BF16,T_BF16}},
    {7,2056,3,{T_F16,T_F16,T_F16,T_F16,T_F16}},
    {1,3072,1,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    {37,4608,5,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    {5,4104,2,{T_F16,T_F16,T_F16,T_F16,T_F16}},
    // c9's smallest and widest blocks in both dtypes (RMS_C9_SLOTS's
    // cases with 6x5120 and 37x4608), c10 (5248-6144: one row a barrier)
    // at its smallest dim and over groups of many rows, c11's smallest.
    {13,4224,3,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    {9,4992,2,{T_F16,T_F16,T_F16,T_F16,T_F16}},
    {5,4352,2,{T_BF16,T_F32,T_BF16,T_BF16,T_F32}},
    {11,4736,4,{T_F16,T_F16,T_F16,T_F16,T_F32}},
    {17,5248,3,{T_BF16,T_F32,T_BF16,T_BF16,T_F32}},
    {23,5376,4,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    {6,6016,2,{T_F16,T_F16,T_F16,T_F16,T_F16}},
    {3,6272,1,{T_F16,T_F32,T_F16,T_F16,T_F16}},
    // c7 at its widest (1024) and c12 (1152-2048: w and the dw sums in
    // shared memory) at its narrowest and widest, over groups of many rows
    // and with fewer rows than the rows in registers.
    {9,1024,2,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    {19,1152,3,{T_BF16,T_BF16,T_BF16,T_BF16,T_BF16}},
    {13,1536,4,{T_F16,T_F32,T_F16,T_F16,T_F32}},
    {1,1920,1,{T_BF16,T_F32,T_BF16,T_BF16,T_BF16}},
    {29,2048,5,{T_F16,T_F16,T_F16,T_F16,T_F16}},
  };
  int bad=0;
  for(auto c:cs){
    if(halfOnly && !(c.t.x!=T_F32 && c.dim%8==0 && c.dim>4096 && c.dim<=5120 && ioOf(F_DX|F_DW,c.t)!=T_ANY)) continue;
    int rows=c.rows, dim=c.dim; size_t n=(size_t)rows*dim;
    std::vector<float> xv(n),wv(dim),dyv(n);
    for(auto&v:xv) v=U(rng);
    for(auto&v:dyv) v=U(rng)*0.5f;
    for(auto&v:wv) v=1+0.1f*U(rng);
    bytes x=enc(xv,c.t.x), w=enc(wv,c.t.w), dy=enc(dyv,c.t.dy);
    std::vector<float> r1,r2,r3,r4,r5; bytes dx1,dw1,dx2,dw2,dx3,dw3,dx4,dw4,dx5,dw5;
    runT(rows,dim,c.gmax,0,c.t,x,w,dy,r1,dx1,dw1);
    runT(rows,dim,c.gmax,2,c.t,x,w,dy,r2,dx2,dw2);
    bool same = r1==r2 && dx1==dx2 && dw1==dw2;
    int nch=(dim+3)/4;
    if(dim%4==0 && nch<=256*8){
      // RMSGRAD_CUDA_STAGES: slots where x and dy are F32 (else the
      // register path), 256 threads; fused against apart.
      runT(rows,dim,c.gmax,1,c.t,x,w,dy,r3,dx3,dw3);
      runT(rows,dim,c.gmax,3,c.t,x,w,dy,r5,dx5,dw5);
      same = same && r3==r5 && dx3==dx5 && dw3==dw5;
    }
    // The same inputs with F32 outputs: each half output is it rounded once.
    Types f=c.t; f.dx=T_F32; f.dw=T_F32;
    runT(rows,dim,c.gmax,0,f,x,w,dy,r4,dx4,dw4);
    bool once = r1==r4;
    for(size_t i=0;i<n && once;i++) once = dec(dx1,i,c.t.dx)==roundOut(dec(dx4,i,T_F32),c.t.dx);
    for(int i=0;i<dim && once;i++) once = dec(dw1,i,c.t.dw)==roundOut(dec(dw4,i,T_F32),c.t.dw);
    // Double reference on the inputs as stored.
    double maxe=0; bool okdx=true, okdw=true;
    std::vector<double> dwr(dim,0);
    for(int b=0;b<rows;b++){ double ss=0,s=0;
      for(int i=0;i<dim;i++){ double xi=dec(x,(size_t)b*dim+i,c.t.x), d=dec(dy,(size_t)b*dim+i,c.t.dy); ss+=xi*xi; s+=d*xi*dec(w,i,c.t.w); }
      double rr=1/std::sqrt(ss/dim+1e-5);
      maxe=std::max(maxe, std::fabs(rr-r1[b])/rr);
      for(int i=0;i<dim;i++){ double xi=dec(x,(size_t)b*dim+i,c.t.x), d=dec(dy,(size_t)b*dim+i,c.t.dy);
        double want=rr*(d*dec(w,i,c.t.w)-xi*s*rr*rr/dim), got=dec(dx1,(size_t)b*dim+i,c.t.dx);
        if(!(std::fabs(got-want)<=1e-4*(1+std::fabs(want))+ulpOf(want,c.t.dx))) okdx=false;
        dwr[i]+=d*xi*rr; } }
    for(int i=0;i<dim;i++){ double got=dec(dw1,i,c.t.dw); if(!(std::fabs(got-dwr[i])<=1e-4*(1+std::fabs(dwr[i]))+1e-5*rows+ulpOf(dwr[i],c.t.dw))) okdw=false; }
    bool ok = same && once && maxe<1e-5 && okdx && okdw;
    if(!ok) bad++;
    printf("%5dx%-5d gmax %3d x=%s w=%s dy=%s -> dx=%s dw=%s: fused==apart:%d rounded-once:%d r_relerr %.2g dx:%d dw:%d %s\n",
      rows, dim, c.gmax, tname(c.t.x), tname(c.t.w), tname(c.t.dy), tname(c.t.dx), tname(c.t.dw), same, once, maxe, okdx, okdw, ok?"ok":"FAIL");
    fflush(stdout);
  }
  return bad;
}
// reduceDigests runs jobs of several groups (each a dw reduce) fused and
// apart and prints, per case, an FNV-1a hash of r, dx and dw's bits: the
// reduce's launch shape (RMS_RED_CH, RMS_RED_U, RMS_RED_EARLY) must not
// change them (cuda.TestReduceShapeOnCPU compares two builds' lines).
int reduceDigests(){
  // Up to 50 groups (every slice's sums in the loop's tail), and 520-1024
  // (16-32 partials a slice: the loads-in-flight steps of 4 and 16).
  std::vector<Case> cs={{40,1024,6},{33,2048,5},{9,8192,4},{65,31,8},{5,9000,2},{300,4,2},{3,257,264},{200,1152,64},
    {1024,4,1024},{600,12,600},{520,64,520}};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> U(-1,1);
  for(auto c:cs){
    size_t n=(size_t)c.rows*c.dim;
    std::vector<float> x(n),w(c.dim),dy(n);
    for(auto&v:x) v=U(rng);
    for(auto&v:dy) v=U(rng)*0.5f;
    for(auto&v:w) v=1+0.1f*U(rng);
    for(int mode=0; mode<3; mode+=2){
      std::vector<float> r,dx,dw;
      run(c.rows,c.dim,c.gmax,mode,x,w,dy,r,dx,dw);
      unsigned long long h=1469598103934665603ull;
      auto mix=[&](const std::vector<float>& v){ for(float f:v){ unsigned u; memcpy(&u,&f,4); for(int k=0;k<4;k++){ h^=(u>>(8*k))&255; h*=1099511628211ull; } } };
      mix(r); mix(dx); mix(dw);
      printf("reduce %5dx%-5d gmax %3d mode %d digest %016llx\n", c.rows, c.dim, c.gmax, mode, h);
    }
  }
  return 0;
}
// Arguments: "eager" (copies land when issued; default late), "half" (only
// class c9's cases, for the RMS_C9_SLOTS variant), "reduce" (only
// reduceDigests).
int main(int argc, char** argv){
  bool halfOnly=false;
  for(int i=1;i<argc;i++){ std::string a=argv[i]; if(a=="eager") g_eager=true; else if(a=="half") halfOnly=true; else if(a=="reduce") return reduceDigests(); else { printf("unknown argument %s\n", argv[i]); return 2; } }
  printf("cp.async copies land %s\n", g_eager ? "when issued" : "when waited for");
  // gmax (the most groups a job is split into) is small here so that groups
  // of several rows, and the next-row prefetch, are exercised cheaply.
  // gmax 1: a job in one group, which stores dw itself (the small jobs).
  // Dims 1024..8192 cover every fused class c0..c6 (c7, c8 and c9 in runMixes) and block sizes that
  // are not a power of two (1152: 160 threads; 2560: 224; 5120: 320 in c5;
  // 4352: 288 in c4, 16 of them without a chunk).
  std::vector<Case> cs={{2,32,264},{7,1,3},{3,257,264},{65,31,8},{7,4097,3},{5,9000,2},{40,1024,6},{5,6144,2},{1,3,264},{9,8192,4},{33,2048,5},{3,4100,2},{6,5120,2},{3,7172,2},{5,1000,2},{300,4,2},{600,12,264},
    {8,1024,1},{4,1152,2},{5,2560,3},{11,4608,2},{5,4352,2},{7,5376,2},{3,3584,1},{4,7168,2},{2,6656,1},{3,257,1},{2,9000,1},{7,1,1}};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> U(-1,1);
  for(auto c:cs){
    if(halfOnly) break;
    int rows=c.rows, dim=c.dim; size_t n=(size_t)rows*dim;
    std::vector<float> x(n),w(dim),dy(n);
    for(auto&v:x) v=U(rng);
    for(auto&v:dy) v=U(rng)*0.5f;
    for(auto&v:w) v=1+0.1f*U(rng);
    std::vector<float> r1,dx1,dw1,r2,dx2,dw2,r3,dx3,dw3,r4,dx4,dw4;
    run(rows,dim,c.gmax,0,x,w,dy,r1,dx1,dw1);
    run(rows,dim,c.gmax,2,x,w,dy,r2,dx2,dw2);
    bool same = memcmp(r1.data(),r2.data(),4*rows)==0 && memcmp(dx1.data(),dx2.data(),4*n)==0 && memcmp(dw1.data(),dw2.data(),4*dim)==0;
    int nch=(dim+3)/4;
    bool slots = dim%4==0 && nch<=256*8;
    if(slots){
      // RMSGRAD_CUDA_STAGES: slots, 256 threads; fused against apart.
      run(rows,dim,c.gmax,1,x,w,dy,r3,dx3,dw3);
      run(rows,dim,c.gmax,3,x,w,dy,r4,dx4,dw4);
      same = same && memcmp(r3.data(),r4.data(),4*rows)==0 && memcmp(dx3.data(),dx4.data(),4*n)==0 && memcmp(dw3.data(),dw4.data(),4*dim)==0;
    }
    // reference, for the register path's outputs and the slots path's
    double maxe=0, maxw=0;
    auto check=[&](const std::vector<float>& rk, const std::vector<float>& dxk, const std::vector<float>& dwk){
      std::vector<double> dwr(dim,0);
      for(int b=0;b<rows;b++){ double ss=0,s=0; for(int i=0;i<dim;i++){ double xv=x[(size_t)b*dim+i], d=dy[(size_t)b*dim+i]; ss+=xv*xv; s+=d*xv*w[i]; }
        double rr=1/std::sqrt(ss/dim+1e-5);
        maxe=std::max(maxe, std::fabs(rr-rk[b])/rr);
        for(int i=0;i<dim;i++){ double xv=x[(size_t)b*dim+i], d=dy[(size_t)b*dim+i]; double want=rr*(d*w[i]-xv*s*rr*rr/dim);
          double got=dxk[(size_t)b*dim+i]; if(!(std::fabs(got-want)<=1e-4*(1+std::fabs(want)))) { if(maxe<1) maxe=1e9; }
          // dim 1: the exact form dy*w*eps*r^3 (compute.DXDim1), held to a
          // relative bound the cancelling general form misses by 100x.
          if(dim==1){ double ex=d*w[0]*1e-5*rr*rr*rr; if(!(std::fabs(got-ex)<=1e-6*std::fabs(ex))) { if(maxe<1) maxe=1e9; } }
          dwr[i]+=d*xv*rr; } }
      for(int i=0;i<dim;i++){ double e=std::fabs(dwk[i]-dwr[i]); if(!(e<=1e-4*(1+std::fabs(dwr[i])*1)+1e-5*rows)) maxw=1e9; maxw=std::max(maxw,e); }
    };
    check(r1,dx1,dw1);
    if(slots) check(r3,dx3,dw3);
    bool ok = same && maxe<1e-5 && maxw<1e-2;
    if(!ok) fails++;
    printf("%5dx%-5d gmax %3d fused==apart (regs%s):%d r_relerr %.2g dw_abserr %.2g %s\n", rows, dim, c.gmax, slots?", smem":"", same, maxe, maxw, ok?"ok":"FAIL");
    fflush(stdout); // a line per case as it ends: the Go test's progress watchdog reads them
  }
  fails += runMixes(rng, halfOnly);
  if(g_leak){ printf("FAIL: a block ended with asynchronous copies not waited for\n"); fails++; }
  return fails?1:0;
}
