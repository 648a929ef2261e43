#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <pthread.h>
#include <time.h>
#include <string.h>
static int fd; static int T; static int SZ; static int N=2000; static int mode;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
void* run(void*a){long id=(long)a; void*b; posix_memalign(&b,4096,SZ); memset(b,1,SZ);
 for(int i=0;i<N;i++){ off_t off=((off_t)(i*T+id))*SZ; if(pwrite(fd,b,SZ,off)!=SZ){perror("w");exit(1);} if(mode==1) fdatasync(fd);} return 0;}
int main(int c,char**v){T=atoi(v[1]);SZ=atoi(v[2]);mode=atoi(v[3]);
 int fl=O_RDWR|O_CREAT|O_DIRECT; if(mode==0) fl|=O_DSYNC;
 fd=open("f",fl,0644); if(fd<0){perror("open");return 1;}
 /* preallocate with zeros, synced */
 { int f2=open("f",O_RDWR); void*z=calloc(1,1<<20); for(long o=0;o<(long)N*T*SZ+(1<<20);o+=1<<20) pwrite(f2,z,1<<20,o); fsync(f2); close(f2);}
 pthread_t th[64]; double t0=now(); for(long i=0;i<T;i++) pthread_create(&th[i],0,run,(void*)i); for(int i=0;i<T;i++) pthread_join(th[i],0);
 double dt=now()-t0; printf("T=%d sz=%d mode=%s ops/s=%.0f lat_us=%.0f\n",T,SZ,mode?"write+fdatasync":"O_DSYNC",N*T/dt,dt/N*1e6); unlink("f"); return 0;}
