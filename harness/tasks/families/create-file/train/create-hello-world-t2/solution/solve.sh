#!/bin/bash
echo world > /app/hello.txt
